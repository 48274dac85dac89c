"""Test corpora and reference outputs shared by the tokenize tests."""

from __future__ import annotations

import gzip
import json
import os
import random
import signal
import socket
import subprocess
import sys
import time

import numpy as np

from megacache.text.sample_corpus import sample_documents, train_sample_tokenizer

EDGE_DOCUMENTS = ["", " ", "a", "ünïcödé 東京 🙂", "tab\tseparated", "  leading and trailing  ", ""]


def documents(n: int = 400, seed: int = 3, newlines: bool = False) -> list[str]:
    docs = sample_documents(n, seed=seed)
    docs[5:5] = EDGE_DOCUMENTS
    if not newlines:
        docs = [d.replace("\n", " ") for d in docs]
    return docs


def write_jsonl(path: str, docs: list[str], key: str = "text", opener=open) -> None:
    with opener(path, "wt", encoding="utf-8") as f:
        for i, d in enumerate(docs):
            f.write(json.dumps({"id": i, key: d}, ensure_ascii=False) + "\n")


def write_input(path: str, docs: list[str]) -> None:
    """Write ``docs`` in the format named by ``path``'s suffix."""
    if path.endswith(".jsonl"):
        write_jsonl(path, docs)
    elif path.endswith(".jsonl.gz"):
        write_jsonl(path, docs, opener=gzip.open)
    elif path.endswith(".jsonl.zst"):
        import zstandard

        data = "".join(json.dumps({"text": d}, ensure_ascii=False) + "\n" for d in docs).encode()
        with open(path, "wb") as f:
            f.write(zstandard.ZstdCompressor().compress(data))
    elif path.endswith(".txt"):
        with open(path, "w", encoding="utf-8") as f:
            f.write("".join(d + "\n" for d in docs))
    elif path.endswith(".parquet"):
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"id": list(range(len(docs))), "text": docs}), path, row_group_size=97)
    else:
        raise ValueError(path)


def train_bpe(path: str, vocab_size: int = 2000) -> str:
    """A real byte-level BPE tokenizer trained on generated text, saved as tokenizer.json."""
    return train_sample_tokenizer(path, vocab_size)


def megatron_reference(megatron, prefix: str, docs: list[str], encode, eod: int | None, dtype) -> None:
    """What megatron-core's IndexedDatasetBuilder writes for these documents, one add_document per
    document, as preprocess_data.py feeds it (EOD after non-empty documents when asked)."""
    builder = megatron.IndexedDatasetBuilder(prefix + ".bin", dtype=dtype)
    for ids in encode(docs):
        ids = list(ids)
        if ids and eod is not None:
            ids.append(eod)
        builder.add_document(ids, [len(ids)] if ids else [])
    builder.finalize(prefix + ".idx")


def megatron_tokenized(megatron, prefix: str, docs: list[str], **flags) -> tuple[tuple[bytes, bytes], np.dtype]:
    """megatron-core's bytes for ``docs`` (EOD appended), as tools/preprocess_data.py writes them
    with the tokenizer its ``build_tokenizer`` makes from ``flags`` (Megatron-LM's defaults for the
    others), in the dtype ``DType.optimal_dtype`` picks for that tokenizer's ``vocab_size``; and that
    dtype."""
    import warnings

    from support.oracles.megatron_worker import build_tokenizer

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        tok = build_tokenizer(flags)
    dtype = megatron.DType.optimal_dtype(tok.vocab_size)
    megatron_reference(megatron, prefix, docs, lambda ds: [tok.tokenize(d) for d in ds], tok.eod, dtype)
    return file_bytes(prefix), np.dtype(dtype)


def file_bytes(prefix: str) -> tuple[bytes, bytes]:
    with open(prefix + ".bin", "rb") as b, open(prefix + ".idx", "rb") as i:
        return b.read(), i.read()


#: how a test runs the megacache command
MEGACACHE = (sys.executable, "-m", "megacache")
#: the commands whose summary says on how many ranks they ran
RANKS_REPORTED = ("tokenize", "merge", "convert", "build", "verify", "pack")


def megacache_cmd(ranks: int, *args: str, program=MEGACACHE) -> list[str]:
    base = [*program, *args]
    return base if ranks == 1 else ["mpiexec", "-n", str(ranks), *base]


def run_megacache(ranks: int, *args: str, check: bool = True, env: dict | None = None,
                  program=MEGACACHE) -> subprocess.CompletedProcess:
    """``program`` (the megacache command, or a script of tests/support that alters it first) on
    ``ranks`` ranks."""
    env = dict(os.environ, PYTHONWARNINGS="ignore", **(env or {}))
    proc = subprocess.run(megacache_cmd(ranks, *args, program=program), capture_output=True, text=True, env=env,
                          timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"megacache {' '.join(args)} on {ranks} rank(s) exited {proc.returncode}:\n"
                             f"{proc.stdout}\n{proc.stderr}")
    # where mpiexec and mpi4py's MPI differ, each process is a job of one rank, and several such
    # jobs writing the same output can still pass a test: the job says how many ranks it had
    if check and args[0] in RANKS_REPORTED and f" on {ranks} rank(s)" not in proc.stdout:
        raise AssertionError(f"megacache {args[0]} launched on {ranks} rank(s) ran on other counts: is mpiexec "
                             f"mpi4py's MPI?\n{proc.stdout}")
    return proc


def tokenize_in_parts(tmp_path, docs: list[str], ranks: int, *flags: str):
    """``docs`` as three .jsonl files under ``tmp_path/in`` (120, 1 and the rest), tokenized on
    ``ranks`` ranks with EOD and small units into ``tmp_path/out{ranks}``: the run and the bytes."""
    os.makedirs(tmp_path / "in", exist_ok=True)
    for f, (a, b) in enumerate([(0, 120), (120, 121), (121, None)]):
        write_jsonl(str(tmp_path / "in" / f"part_{f}.jsonl"), docs[a:b])
    run = run_megacache(ranks, "tokenize", "--input", str(tmp_path / "in"), "--output-prefix",
                        str(tmp_path / f"out{ranks}"), "--append-eod", "--unit-bytes", "8K", *flags)
    return run, file_bytes(str(tmp_path / f"out{ranks}_text_document"))


def processes() -> dict[int, tuple[int, str]]:
    """Every process's parent and state (``Z``: exited, not yet reaped), from /proc."""
    table = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat") as f:
                    state, ppid = f.read().rsplit(")", 1)[1].split()[:2]
            except (OSError, ValueError):
                continue
            table[int(name)] = (int(ppid), state)
    return table


def children(table: dict[int, tuple[int, str]], pid: int) -> list[int]:
    return [p for p, (ppid, _) in table.items() if ppid == pid]


def process_tree(pid: int) -> list[int]:
    """``pid`` and every process below it, parents first."""
    table = processes()
    tree, frontier = [], [pid]
    while frontier:
        tree += frontier
        frontier = [c for p in frontier for c in children(table, p)]
    return tree


def kill_tree(pid: int, timeout: float = 30.0) -> None:
    """SIGKILL a launcher and everything below it, and return once none of them can still write.
    Killing the launcher alone is not enough: mpiexec's proxies and ranks sit in process groups of
    their own and go on working until the proxy notices; and a rank inside a rename or fsync
    completes it before it dies."""
    tree = process_tree(pid)
    for p in reversed(tree):
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + timeout
    while any(processes().get(p, (0, "Z"))[1] != "Z" for p in tree):
        if time.monotonic() > deadline:
            raise AssertionError(f"processes {tree} still running {timeout:.0f} s after SIGKILL")
        time.sleep(0.01)


def array_of(ids) -> np.ndarray:
    return np.asarray(ids, dtype=np.int64)


def free_port() -> int:
    """A loopback port for a torch.distributed rendezvous in a test: free now, and below the
    kernel's ephemeral range, so that no connection or listener another process opens meanwhile
    (MPI's, a filesystem client's) is given it before the rendezvous binds it, as one given by the
    kernel (port 0) can be."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            ephemeral = int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        ephemeral = 32768
    rng = random.Random()
    for _ in range(100):
        port = rng.randrange(max(1024, ephemeral // 2), ephemeral)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise AssertionError(f"no free loopback port below {ephemeral} in 100 tries")
