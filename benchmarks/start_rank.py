"""One rank of a training job's start, as ``python benchmarks/start_rank.py SPEC.json RANK_OUT.json``
with torchrun's environment (RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT): the start suite
(``start.py``) launches two at once and reads what each writes.

``spec["mode"]``:

* ``megatron``: megatron-core's data path as Megatron-LM's training takes it (run in the interpreter
  of the megatron-core measured, 0.19.2; megatron-core, torch and numpy only, never megacache):
  ``init_process_group("gloo")``, the tokenizer from Megatron-LM's flags (``build_tokenizer``), the
  blend read from ``--data-args-path`` or ``--per-split-data-args-path`` and the sequences file from
  ``--per-dataset-sequences-path`` as training reads them, ``GPTDatasetConfig`` with training's
  defaults, ``BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()``, then
  the train split's sample 0.
* ``megacache``: the same start through megacache's API (Python 3.11, megacache installed):
  ``init_process_group("gloo")``, ``BuildConfig.from_megatron_flags``, ``prepare_cache``, and the
  train split's sample 0 from the splits it opened.

Each rank writes: the seconds from its process's start (``/proc``: the kernel's start time of the
process, so the interpreter's own start counts) to each mark; ``data_s``, from just before the data
flags are read to sample 0 having been read (the part of the start the cache changes), and
``build_s``, the builder call (or ``prepare_cache``) alone; the files it opened, counted by a
Python audit hook (event ``open``: ``open()``, ``os.open``, ``numpy.load``/``memmap`` and Python's
imports; files that C code opens, such as shared libraries, are not counted) over the whole process
and within ``data_s``; its peak RSS when sample 0 had been read; and which sample that was (dataset,
its sample, the documents), for the suite to check against megacache's reading of the same cache.
With ``spec["profile"]``, ``data_s`` runs under cProfile and the stats go to ``RANK_OUT.prof`` and a
text summary to ``RANK_OUT.prof.txt``.
"""

import sys

if __name__ == "__main__":
    # First thing in the rank: every Python-level open from here on is counted.
    _OPENS: list = []
    _MMAPS = [0]

    def _audit(event, args):
        if event == "open":
            if not (isinstance(args[0], str) and args[0].startswith("/proc/")):  # process_age's own
                _OPENS.append(args[0])
        elif event == "mmap.__new__":
            _MMAPS[0] += 1

    sys.addaudithook(_audit)

import json
import os
import resource
from types import SimpleNamespace

SPLITS = ("train", "valid", "test")


def process_age() -> float:
    """Seconds since the kernel started this process (10 ms resolution: clock ticks)."""
    with open("/proc/self/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    started = int(fields[19]) / os.sysconf("SC_CLK_TCK")  # field 22 of the whole line
    with open("/proc/uptime") as f:
        return float(f.read().split()[0]) - started


def _suffix(path) -> str:
    if isinstance(path, int):
        return "fd"
    name = os.path.basename(os.fsdecode(path))
    if name.endswith((".py", ".pyc", ".so")) or "/__pycache__/" in os.fsdecode(path):
        return "python"
    return os.path.splitext(name)[1] or "other"


def _opens(paths: list) -> dict:
    by: dict = {}
    for p in paths:
        k = _suffix(p)
        by[k] = by.get(k, 0) + 1
    return {"calls": len(paths), "files": len({os.fsdecode(p) if not isinstance(p, int) else p for p in paths}),
            "by_suffix": dict(sorted(by.items()))}


# ------------------------------------------------------------------------------------------------
# megatron-core, as Megatron-LM's training calls it


def megatron_tokenizer(spec: dict):
    """``build_tokenizer(args)`` as Megatron-LM 0.18-0.19 training calls it for ``--tokenizer-type
    NullTokenizer --vocab-size V``: the attributes it reads, at arguments.py's defaults."""
    from megatron.core.tokenizers.utils.build_tokenizer import build_tokenizer

    args = SimpleNamespace(tokenizer_type="NullTokenizer", vocab_size=spec["vocab_size"], tokenizer_model=None,
                           null_tokenizer_eod_id=None, null_tokenizer_pad_id=-1, pad_vocab_size=True,
                           padded_vocab_size=None, make_vocab_size_divisible_by=128, tensor_model_parallel_size=1,
                           rank=int(os.environ.get("RANK", "0")))
    return build_tokenizer(args)


def megatron_data(spec: dict, tokenizer):
    """GPTDatasetConfig from the data flags, as Megatron-LM's ``core_gpt_dataset_config_from_args``
    and ``get_blend_and_blend_per_split`` make it (training's defaults for every other field)."""
    from megatron.core.datasets.gpt_dataset import GPTDatasetConfig
    from megatron.core.datasets.utils import get_blend_from_list

    blend = blend_per_split = None
    if spec["layout"] == "split":  # --data-args-path FILE --split S
        with open(spec["data_args_path"]) as f:
            blend = get_blend_from_list(f.read().split())
    else:  # --per-split-data-args-path FILE.json
        with open(spec["per_split_data_args_path"]) as f:
            per_split = json.load(f)
        blend_per_split = [get_blend_from_list(per_split[s] if not isinstance(per_split[s], str)
                                               else per_split[s].split()) for s in SPLITS]
    sequences = None
    if spec.get("sequences_path"):  # --per-dataset-sequences-path FILE.json
        with open(spec["sequences_path"]) as f:
            sequences = json.load(f)
    return GPTDatasetConfig(
        random_seed=spec["seed"], sequence_length=spec["seq_length"], blend=blend, blend_per_split=blend_per_split,
        split=spec["split"] if blend is not None else None, num_dataset_builder_threads=1,
        path_to_cache=spec["cache"], mmap_bin_files=True, tokenizer=tokenizer, reset_position_ids=False,
        reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=True,
        mid_level_dataset_surplus=spec["surplus"], fast_cache_load=bool(spec.get("fast")),
        defer_npy_index_mmap=bool(spec.get("fast")), sequences_per_dataset=sequences,
        data_parallel_size=int(os.environ.get("WORLD_SIZE", "1")))


def run_megatron(spec: dict, marks: dict, window) -> dict:
    import warnings

    warnings.simplefilter("ignore")
    import numpy
    import torch
    import torch.distributed as dist
    import megatron.core
    from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
    from megatron.core.datasets.gpt_dataset import GPTDataset

    marks["import"] = process_age()
    dist.init_process_group("gloo")
    marks["init_process_group"] = process_age()
    tokenizer = megatron_tokenizer(spec)
    marks["tokenizer"] = process_age()

    with window:
        config = megatron_data(spec, tokenizer)
        marks["config"] = process_age()
        datasets = BlendedMegatronDatasetBuilder(GPTDataset, spec["sizes"], lambda: True, config).build()
        marks["build"] = process_age()
        datasets[0][0]
    train = datasets[0]
    dataset, sample = int(train.dataset_index[0]), int(train.dataset_sample_index[0])
    documents = train.datasets[dataset]._query_document_sample_shuffle_indices(sample)[1].tolist()
    versions = {"python": sys.version.split()[0], "megatron_core": megatron.core.__version__,
                "torch": torch.__version__, "numpy": numpy.__version__}
    dist.barrier()  # neither rank leaves while the other may still need the store
    return {"versions": versions, "sample": {"dataset": dataset, "sample": sample, "documents": documents},
            "lengths": [None if d is None else len(d) for d in datasets]}


# ------------------------------------------------------------------------------------------------
# megacache's API


def megacache_config(spec: dict):
    """The BuildConfig of the same flags, made as a user makes it from training's flags."""
    from megacache.interfaces.api import BuildConfig

    data = ({"data_args_path": spec["data_args_path"], "split": spec["split"]} if spec["layout"] == "split" else
            {"per_split_data_args_path": spec["per_split_data_args_path"]})
    return BuildConfig.from_megatron_flags(
        {**data, "seed": spec["seed"], "seq_length": spec["seq_length"], "data_cache_path": spec["cache"],
         "mid_level_dataset_surplus": spec["surplus"], "tokenizer_type": "NullTokenizer",
         "vocab_size": spec["vocab_size"], **spec["training"]},
        megatron_version=spec["megatron_version"])


def run_megacache(spec: dict, marks: dict, window) -> dict:
    import numpy
    import torch
    import torch.distributed as dist

    from importlib.metadata import version

    from megacache.interfaces.api import prepare_cache

    marks["import"] = process_age()
    dist.init_process_group("gloo")
    marks["init_process_group"] = process_age()
    marks["tokenizer"] = marks["init_process_group"]  # part of the configuration, within data_s
    with window:
        cfg = megacache_config(spec)
        marks["config"] = process_age()
        ready = prepare_cache(cfg, timeout_s=3600)
        marks["build"] = process_age()
        ready.splits["train"][0]
    train = ready.splits["train"]
    dataset, sample = train.source(0)
    documents = train.document_ids(0).tolist()
    versions = {"python": sys.version.split()[0], "megacache": version("megacache"),
                "torch": torch.__version__, "numpy": numpy.__version__}
    built = ready.built is not None
    dist.barrier()
    return {"versions": versions, "sample": {"dataset": dataset, "sample": sample, "documents": documents},
            "lengths": [len(ready.splits[s]) for s in SPLITS if s in ready.splits], "built": built}


# ------------------------------------------------------------------------------------------------


class Window:
    """The data window: its start and end (process age), the opens within it, and cProfile when asked."""

    def __init__(self, profile: str | None):
        self.profile, self.profiler = profile, None

    def __enter__(self):
        if self.profile:
            import cProfile

            self.profiler = cProfile.Profile()
        self.opens_before, self.mmaps_before = len(_OPENS), _MMAPS[0]
        self.start = process_age()
        if self.profiler:
            self.profiler.enable()
        return self

    def __exit__(self, *exc):
        if self.profiler:
            self.profiler.disable()
        self.end = process_age()
        self.rss_kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        self.opens_process = list(_OPENS)
        self.opens = self.opens_process[self.opens_before:]
        self.mmaps = _MMAPS[0] - self.mmaps_before
        return False

    def write_profile(self) -> None:
        if not self.profiler:
            return
        import io
        import pstats

        self.profiler.dump_stats(self.profile)
        text = io.StringIO()
        stats = pstats.Stats(self.profiler, stream=text).strip_dirs()
        stats.sort_stats("cumulative").print_stats(45)
        stats.sort_stats("tottime").print_stats(30)
        with open(self.profile + ".txt", "w") as f:
            f.write(text.getvalue())


def main(spec_path: str, out: str) -> None:
    started = process_age()
    with open(spec_path) as f:
        spec = json.load(f)
    marks = {"main": started}
    window = Window(out + ".prof" if spec.get("profile") else None)
    result = (run_megatron if spec["mode"] == "megatron" else run_megacache)(spec, marks, window)
    window.write_profile()
    record = {"rank": int(os.environ["RANK"]), "mode": spec["mode"], "config": spec["config"],
              "whole_s": window.end, "data_s": window.end - window.start,
              "build_s": marks["build"] - marks["config"], "sample_s": window.end - marks["build"],
              "marks": marks, "rss_kb": window.rss_kb,
              "opens": {"process": _opens(window.opens_process), "data": _opens(window.opens),
                        "data_mmaps": window.mmaps},
              **result}
    with open(out, "w") as f:
        json.dump(record, f)
        f.flush()
        os.fsync(f.fileno())


if __name__ == "__main__":
    main(*sys.argv[1:])
    # The start is measured; torch's and megatron-core's teardown (seconds on 2 busy cores) is not.
    sys.stdout.flush()
    os._exit(0)
