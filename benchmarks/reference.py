"""megatron-core's side of each workload, one process, writing into OUT what megacache must equal.
Prints ``  phases: import X s, …`` as megacache does, so both are read alike.

    python -m benchmarks.reference build SPEC.json OUT     # BlendedMegatronDatasetBuilder(...).build()
    python -m benchmarks.reference tokenize SPEC.json OUT  # encode_batch_fast + IndexedDatasetBuilder
    python -m benchmarks.reference kernel WEIGHTS.npy SIZE OUT  # helpers_cpp.build_blending_indices alone
    python -m benchmarks.reference members SPEC.json OUT I,J,..  # the GPTDatasets of a blend's datasets I, J, ..

The build's phases are megatron-core's own functions timed where they are called (a wrapper that
adds up their seconds; nothing else changes): loading the low-level datasets, the document,
sample and shuffle indices, the blend, ``numpy.save``; ``build_other`` is the rest of ``build()``;
``setup`` the process group, the null tokenizer and the config.
"""

from __future__ import annotations

import functools
import json
import os
import socket
import sys
import time
import warnings

T0 = time.perf_counter()


def _print_phases(phases: dict[str, float]) -> None:
    print("  phases: " + ", ".join(f"{k} {v:.3f} s" for k, v in phases.items()), flush=True)


_inside_timed = [False]


def _timed(phases: dict[str, float], name: str, fn):
    """``fn`` adding its seconds to ``phases[name]``; a timed call inside another (megatron-core's
    document index calls itself for a separate last epoch) counts once, in the outer one."""
    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        if _inside_timed[0]:
            return fn(*args, **kwargs)
        _inside_timed[0] = True
        t = time.perf_counter()
        try:
            return fn(*args, **kwargs)
        finally:
            phases[name] = phases.get(name, 0.0) + time.perf_counter() - t
            _inside_timed[0] = False
    return wrapper


def _time_phases(phases: dict[str, float]):
    """megatron-core's GPTDataset functions (loading, the three indices, ``numpy.save``) wrapped to add
    their seconds to ``phases``; returns the wrapper for more."""
    import numpy
    from megatron.core.datasets import gpt_dataset, helpers
    from megatron.core.datasets.gpt_dataset import GPTDataset

    timed = functools.partial(_timed, phases)
    GPTDataset.build_low_level_dataset = staticmethod(timed("load", GPTDataset.build_low_level_dataset))
    gpt_dataset._build_document_index = timed("document_index", gpt_dataset._build_document_index)
    helpers.build_sample_idx = timed("sample_index", helpers.build_sample_idx)
    gpt_dataset._build_shuffle_index = timed("shuffle_index", gpt_dataset._build_shuffle_index)
    numpy.save = timed("save", numpy.save)
    return timed


def _config(a: dict, out: str):
    """The ``GPTDatasetConfig`` of a build spec, caching into ``out`` (a null tokenizer)."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.tokenizers import MegatronTokenizer

    tokenizer = MegatronTokenizer.from_pretrained(metadata_path={"library": "null"}, vocab_size=a["vocab_size"])
    return GPTDatasetConfig(random_seed=a["seed"], sequence_length=a["seq_length"],
                            blend=(a["prefixes"], a["weights"]), split=a["split"], tokenizer=tokenizer,
                            reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False,
                            add_extra_token_to_sequence=True, drop_last_partial_validation_sequence=True,
                            mid_level_dataset_surplus=a["surplus"], path_to_cache=out)


def build(spec_path: str, out: str) -> None:
    with open(spec_path) as f:
        a = json.load(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import torch.distributed as dist
        from megatron.core.datasets import helpers
        from megatron.core.datasets.blended_megatron_dataset_builder import (
            BlendedMegatronDatasetBuilder,
        )
        from megatron.core.datasets.gpt_dataset import GPTDataset
        import megatron.core.tokenizers  # noqa: F401 (timed as an import; _config uses it)
    phases = {"import": time.perf_counter() - T0}
    timed = _time_phases(phases)
    helpers.build_blending_indices = timed("blend", helpers.build_blending_indices)

    # megatron-core 0.16.1 caches a blend only with a process group: a one-process gloo group.
    t = time.perf_counter()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", world_size=1, rank=0)
    config = _config(a, out)
    phases["setup"] = time.perf_counter() - t
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        BlendedMegatronDatasetBuilder(GPTDataset, a["sizes"], lambda: True, config).build()
    timed_inside = sum(v for k, v in phases.items() if k not in ("import", "setup"))
    phases["build_other"] = time.perf_counter() - t - timed_inside
    dist.destroy_process_group()
    _print_phases(phases)


def members(spec_path: str, out: str, which: str) -> None:
    """The GPTDataset entries of some of a blend's datasets (their indices in the blend, comma
    separated), built as ``build`` would build them inside the whole blend: the same config, each
    dataset's samples per split from megatron-core's own ``_get_size_per_split_per_dataset`` with
    the surplus, and the builder's own ``_build_megatron_dataset_splits`` (what it calls per dataset
    of a blend). No process group: a GPTDataset caches without one. The seed suite (``seed.py``)
    checks megacache's entries of a blend too large for megatron-core to build whole here."""
    with open(spec_path) as f:
        a = json.load(f)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import blended_megatron_dataset_builder as builder_module
        from megatron.core.datasets.gpt_dataset import GPTDataset
        from megatron.core.datasets.utils import normalize
        import megatron.core.tokenizers  # noqa: F401 (timed as an import; _config uses it)
    phases = {"import": time.perf_counter() - T0}
    _time_phases(phases)

    t = time.perf_counter()
    config = _config(a, out)
    builder = builder_module.BlendedMegatronDatasetBuilder(GPTDataset, a["sizes"], lambda: True, config)
    prefixes, weights = config.blend
    per_dataset = builder_module._get_size_per_split_per_dataset(normalize(weights), a["sizes"],
                                                                 surplus=config.mid_level_dataset_surplus)
    phases["setup"] = time.perf_counter() - t
    t = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for i in (int(w) for w in which.split(",")):
            builder._build_megatron_dataset_splits(prefixes[i], config.split_matrix, per_dataset[i], False)
    timed_inside = sum(v for k, v in phases.items() if k not in ("import", "setup"))
    phases["build_other"] = time.perf_counter() - t - timed_inside
    _print_phases(phases)


def tokenize(spec_path: str, out: str) -> None:
    with open(spec_path) as f:
        a = json.load(f)
    os.environ["RAYON_NUM_THREADS"] = str(a["threads"])  # read when tokenizers starts its pool
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import numpy as np
        from megatron.core.datasets.indexed_dataset import IndexedDatasetBuilder
        from tokenizers import Tokenizer
    phases = {"import": time.perf_counter() - T0}

    t = time.perf_counter()
    docs = []
    for name in sorted(os.listdir(a["corpus"])):  # zero-padded shard names: megacache's order
        with open(os.path.join(a["corpus"], name), encoding="utf-8") as f:
            docs.extend(json.loads(line)["text"] for line in f)
    phases["read"] = time.perf_counter() - t

    t = time.perf_counter()
    tok = Tokenizer.from_file(a["tokenizer"])
    eod = tok.token_to_id("<|endoftext|>")
    encoded = []
    for i in range(0, len(docs), 1024):
        encoded.extend(e.ids for e in tok.encode_batch_fast(docs[i:i + 1024], add_special_tokens=False))
    phases["encode"] = time.perf_counter() - t

    # gigatoken's raw throughput on the same texts, threads and batches: ids as Python lists (the
    # issue's bar: what Python code gets from it) and as awkward arrays (its fastest call).
    import gigatoken

    for phase, call in (("encode_gigatoken_list", "encode_batch_list"), ("encode_gigatoken", "encode_batch")):
        t = time.perf_counter()
        encode = getattr(gigatoken.Tokenizer(a["tokenizer"]), call)
        for i in range(0, len(docs), 1024):
            encode(docs[i:i + 1024], parallel=a["threads"] > 1)
        phases[phase] = time.perf_counter() - t

    t = time.perf_counter()
    builder = IndexedDatasetBuilder(os.path.join(out, "corpus_text_document.bin"),
                                    dtype=np.uint16 if tok.get_vocab_size() < 65500 else np.int32)
    # One add_document per document, EOD after non-empty ones, as preprocess_data.py feeds the
    # builder: this per-document loop is the baseline being measured.
    for ids in encoded:
        if ids:
            ids.append(eod)
        builder.add_document(ids, [len(ids)] if ids else [])
    builder.finalize(os.path.join(out, "corpus_text_document.idx"))
    phases["write"] = time.perf_counter() - t
    _print_phases(phases)


def _helpers_cpp():
    """megatron-core's compiled helpers alone: importing them through their package would import
    all of megatron-core and torch (seconds of start-up that have nothing to do with the kernel)."""
    import importlib.machinery
    import importlib.util

    package = importlib.util.find_spec("megatron.core").submodule_search_locations[0]
    directory = os.path.join(package, "datasets")
    name = next(n for n in os.listdir(directory) if n.startswith("helpers_cpp.")
                and n.endswith(tuple(importlib.machinery.EXTENSION_SUFFIXES)))
    spec = importlib.util.spec_from_file_location("helpers_cpp", os.path.join(directory, name))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def kernel(weights_path: str, size: str, out: str) -> None:
    import numpy as np

    from megacache.formats.npy import load_npy
    from megacache.runtime.fsio import sync_filesystems

    helpers_cpp = _helpers_cpp()
    phases = {"import": time.perf_counter() - T0}
    weights, n = load_npy(weights_path, mmap=False), int(size)
    t = time.perf_counter()
    dataset_index = np.zeros(n, dtype=np.int16)
    dataset_sample_index = np.zeros(n, dtype=np.int64)
    helpers_cpp.build_blending_indices(dataset_index, dataset_sample_index, weights, len(weights), n, False)
    phases["blend"] = time.perf_counter() - t
    t = time.perf_counter()
    np.save(os.path.join(out, "dataset_index.npy"), dataset_index)
    np.save(os.path.join(out, "dataset_sample_index.npy"), dataset_sample_index)
    phases["write"] = time.perf_counter() - t
    t = time.perf_counter()
    sync_filesystems([out])  # durable, as megacache's side makes its arrays
    phases["sync"] = time.perf_counter() - t
    _print_phases(phases)


if __name__ == "__main__":
    {"build": build, "tokenize": tokenize, "kernel": kernel, "members": members}[sys.argv[1]](*sys.argv[2:])
