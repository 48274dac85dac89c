"""Every command on two emulated nodes of two ranks each, on a GlusterFS volume, byte for byte
against the same command as one process on the host, writing to local disk: tokenize (JSON lines
and Parquet), merge, convert to ``.pbin`` and back, build of one prefix and of a blend, verify.

A cache's hash holds the dataset's path, so the one-process builds read the datasets the cluster
wrote, from the volume, and write their caches locally."""

from __future__ import annotations

import os

from support.inputs.corpus import documents, file_bytes, run_megacache, write_input
from support.systems.faults import final_files, leftovers
from support.sweeps import build_args


def test_every_command_on_two_nodes_equals_one_local_process(cluster, tmp_path):
    shared = cluster.volume.path
    local = str(tmp_path)
    docs = documents(3000, seed=21)
    os.makedirs(f"{shared}/jsonl")
    os.makedirs(f"{shared}/parquet")
    for i in range(5):
        write_input(f"{shared}/jsonl/part{i}.jsonl", docs[i * 400:(i + 1) * 400])
    for i in range(2):
        write_input(f"{shared}/parquet/part{i}.parquet", docs[2000 + i * 500:2500 + i * 500])
    os.makedirs(f"{shared}/out")

    def both(*args: str, where: str = shared):
        """The command on the cluster (its paths under the volume) and as one local process."""
        cluster.run(2, *args)
        run_megacache(1, *(a.replace(f"{shared}/out", f"{local}") for a in args))

    # tokenize: small work units, so that every rank has several
    for name in ("jsonl", "parquet"):
        both("tokenize", "--input", f"{shared}/{name}", "--output-prefix", f"{shared}/out/{name}",
             "--tokenizer", "byte", "--append-eod", "--unit-bytes", "16K")
        assert file_bytes(f"{shared}/out/{name}_text_document") == file_bytes(f"{local}/{name}_text_document")
    both("merge", f"{shared}/out/jsonl_text_document", f"{shared}/out/parquet_text_document",
         "--output-prefix", f"{shared}/out/merged")
    assert file_bytes(f"{shared}/out/merged") == file_bytes(f"{local}/merged")
    both("convert", f"{shared}/out/merged", f"{shared}/out/merged.pbin")
    both("convert", f"{shared}/out/merged.pbin", f"{shared}/out/back")
    assert open(f"{shared}/out/merged.pbin", "rb").read() == open(f"{local}/merged.pbin", "rb").read()
    assert file_bytes(f"{shared}/out/back") == file_bytes(f"{shared}/out/merged")

    # builds read the cluster's datasets (their path is in the cache hash); caches differ in place only
    prefixes = [f"{shared}/out/{p}" for p in ("jsonl_text_document", "parquet_text_document", "merged")]
    for name, data, samples in [("one", prefixes[2:], 20_000), ("blend", ["2", prefixes[0], "1", prefixes[1],
                                                                             "0.5", prefixes[2]], 30_000)]:
        cluster.run(2, *build_args(f"{shared}/cache-{name}", data, 64, samples))
        run_megacache(1, *build_args(f"{local}/cache-{name}", data, 64, samples))
        ours, reference = final_files(f"{shared}/cache-{name}"), final_files(f"{local}/cache-{name}")
        assert reference and ours == reference, name
        assert not leftovers(f"{shared}/cache-{name}")
    verified = cluster.run(2, "verify", *prefixes, f"{shared}/out/merged.pbin", f"{shared}/cache-one",
                           f"{shared}/cache-blend", "--vocab-size", "257")
    assert verified.stdout.count("ok") >= 6, verified.stdout
    assert not leftovers(f"{shared}/out")
