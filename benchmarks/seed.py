"""The seed's case: ``python -m benchmarks run --suite seed [--factor F] [--ranks P]``.

The 1000-dataset build (``workloads.build_blend``) at 100 times its size with documents of 10,000
tokens: 5e12 tokens, 5e8 documents, 1.2e9 train samples, L = 4096, a weighted blend. megatron-core
cannot build it here (hours, over 100 GB of memory), so instead of a reference build beside it, one
run measures and checks, in this order, in one work directory removed at the end:

1. the inputs (sparse ``.bin`` files; the ``.idx`` files alone are 20 bytes a document, 10 GB at
   full size), after a check that the disk has room for them and the outputs;
2. the disk's own write and read rates (``floor.direct_rates``: O_DIRECT), the floors: the build's
   bytes written and verify's bytes read from the disk, at those rates;
3. ``megacache build`` under ``mpiexec -n P`` (``harness.run_program``): wall time from outside,
   each phase, each rank's peak RSS, CPU seconds and bytes written;
4. ``mpiexec -n P megacache verify`` of the cache, after a sync: wall time, peak RSS and bytes read
   from the disk (those the page cache did not hold) per rank;
5. exactness at that scale: a few member datasets (the largest, the smallest and one drawn in
   between with a fixed seed) built by megatron-core 0.16.1 alone (``reference.members``: their
   GPTDatasets as its builder makes them inside the blend), every file compared byte for byte with
   megacache's of the same name; and each blend's samples per dataset (its ``dataset_index``
   counted) against the exact largest-remainder apportionment of its size by its weights. Megatron's
   greedy is not largest remainder (../shared/docs/blending-and-shuffling.md §2.1): the differences
   are recorded, not asserted;
6. the seed's blend alone: 2e9 samples over 1000 uniformly random weights (seed 0, at factor 100;
   the size scales with the factor) through the code a build runs (``benchmarks.kernel``:
   ``BlendFiles``), cut over the P ranks as a build cuts it (a guessed start per chunk, then
   confirmed or repaired), its arrays written and made durable as a build's, timed from outside,
   then removed. Its counts are compared with largest remainder too. No megatron-core run at that
   size: the seed's own figures (``SEED_CLAIMS``) are recorded beside it.

One JSON line per run in ``benchmarks/results/seed.jsonl`` and ``SEED.md`` beside it: the latest
run at the largest factor, then the build at each factor run (``growth``: time, the disk's floor,
CPU, bytes, memory per rank, and their growth with the tokens); ``python -m benchmarks.seed report
[--results FILE] [--doc docs/benchmarks.md]`` rewrites them (and the seed table of that document)
from the file alone. ``python -m benchmarks project`` takes the build's
phases from the latest record at the largest factor.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import sys
import tempfile
import time
from fractions import Fraction

from .harness import (ROOT, BenchmarkFailure, append_record, describe_outputs, machine_info, quiet_filesystem,
                      run_program, shown)

SEED_RESULTS = os.path.join(ROOT, "benchmarks", "results", "seed.jsonl")
SPLITS = ("train", "valid", "test")
#: member datasets built by megatron-core: the largest, the smallest, and this many minus 2 drawn between
MEMBERS = 3
#: the seed's blend at factor 100 (it scales with the factor, at least BLEND_MIN)
BLEND_SAMPLES = 2e9
BLEND_MIN = 1_000_000
BLEND_DATASETS = 1000
#: what the seed says of that blend, recorded beside the measurement (not measured by this benchmark)
SEED_CLAIMS = {"samples": 2e9, "datasets": 1000, "megatron_s": 48 * 60, "seed_s": 18.0, "seed_exact": False}
#: the disk's floor: the expected outputs, within these bounds
FLOOR_MIN, FLOOR_MAX = 64 << 20, 4 << 30
#: bytes of a dataset's ``.idx`` per document (one sequence each: length int32, pointer int64,
#: document index int64) and of its header
IDX_PER_DOCUMENT, IDX_HEADER = 20, 64
#: samples per bincount when counting a blend's dataset_index (128 MiB of int16 at a time)
COUNT_BLOCK = 1 << 26


def _log(message: str) -> None:
    print(message, flush=True)


# ------------------------------------------------------------------------------------------------
# Disk space


def expected_documents(suite, factor: float) -> list[int]:
    """Each dataset's documents, as ``workloads.build_blend`` will write them."""
    from .workloads import MEAN_LENGTH, blend_shares

    share, _ = blend_shares(suite.blend_datasets)
    tokens = 5e10 * factor
    return [max(1000, int(tokens * s / (suite.mean_length or MEAN_LENGTH))) for s in share]


def estimated_outputs(suite, factor: float) -> float:
    """The cache's bytes before any input exists: per blended sample (train, valid and test as
    ``build_blend`` sizes them) its two blend entries (10 bytes), and about 1.5 sample-index rows
    (8 bytes), shuffle entries (4) and L / mean document-index entries (4) in its dataset's
    entries, which cover whole epochs (1.46 in the 1/100 run)."""
    from .workloads import MEAN_LENGTH, SEQ_LENGTH

    samples = (1 + 0.01 + 0.001) * 1.2e7 * factor
    return samples * (10 + 1.5 * (8 + 4 + 4 * SEQ_LENGTH / (suite.mean_length or MEAN_LENGTH)))


def _check_room(work: str, need: int, what: str) -> None:
    free = shutil.disk_usage(work).free
    if need > 0.95 * free:
        raise BenchmarkFailure(
            f"the seed case needs {need / 2**30:.1f} GiB of disk for {what}, and the filesystem of "
            f"{os.path.dirname(work)} has "
            f"{free / 2**30:.1f} GiB free: free some space, run a smaller --factor, or point TMPDIR at a "
            f"larger filesystem")


def planned_outputs(case, work: str) -> dict:
    """The cache's arrays as megacache plans them (no lengths read): ``{"bytes", "by_dataset"}``,
    the latter each dataset's GPTDataset bytes (the three splits), exact but the small
    descriptions. For the room check before anything large is written."""
    from megacache.builders.blend import BLEND_ARRAYS
    from megacache.builders.build import BuildConfig, plan
    from megacache.builders.gpt import array_shapes
    from megacache.megatron.blends import parse_blend
    from megacache.megatron.tokenizer import tokenizer_identifiers
    from megacache.runtime.comm import SingleComm

    a = case.spec
    blend = parse_blend([word for w, p in zip(a["weights"], a["prefixes"]) for word in (repr(w), p)])
    cfg = BuildConfig(seq_length=a["seq_length"], sizes=tuple(a["sizes"]),
                      tokenizer=tokenizer_identifiers("NullTokenizer", vocab_size=a["vocab_size"]), blend=blend,
                      split=a["split"], seed=a["seed"], cache_dir=os.path.join(work, "unused-cache"),
                      surplus=a["surplus"])
    planned = plan(cfg, SingleComm(), decide_reuse=False)
    by_dataset: dict[str, int] = {}
    for task in planned.gpt:
        size = sum(math.prod(shape) * dtype.itemsize + 128 for dtype, shape in array_shapes(task.plan).values())
        by_dataset[task.data_path] = by_dataset.get(task.data_path, 0) + size
    blends = sum((b.size * d.itemsize + 128) for b in planned.blends for d in BLEND_ARRAYS.values())
    return {"bytes": sum(by_dataset.values()) + blends, "by_dataset": by_dataset}


# ------------------------------------------------------------------------------------------------
# Exactness


def choose_members(documents: list[int], count: int = MEMBERS, seed: int = 1234) -> list[int]:
    """The largest and the smallest dataset (by documents; the lowest index among equals) and
    ``count - 2`` drawn between them with a fixed seed, in increasing order."""
    import numpy as np

    order = sorted(range(len(documents)), key=lambda i: (documents[i], i))
    ends = {order[-1], order[0]}
    rest = [i for i in order if i not in ends]
    drawn = np.random.default_rng(seed).choice(len(rest), size=min(max(0, count - 2), len(rest)), replace=False)
    return sorted(ends | {rest[int(k)] for k in drawn})


def compare_members(ours: str, theirs: str) -> dict:
    """Every file megatron-core wrote in ``theirs`` against megacache's of the same name in
    ``ours``, byte for byte."""
    import filecmp

    names = sorted(os.listdir(theirs))
    missing = [n for n in names if not os.path.exists(os.path.join(ours, n))]
    present = [n for n in names if n not in missing]
    _, differ, errors = filecmp.cmpfiles(ours, theirs, present, shallow=False)
    return {"files": len(names), "bytes": sum(os.path.getsize(os.path.join(theirs, n)) for n in names),
            "missing": missing, "differ": differ + errors, "identical": bool(names) and not missing
            and not differ and not errors}


def largest_remainder(weights: list[float], size: int) -> list[int]:
    """``size`` samples apportioned by ``weights`` by the largest remainder (Hamilton), in exact
    rational arithmetic: quota_d = size * w_d / sum(w), floors, then one more to each of the
    largest remainders (ties to the lowest index)."""
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    quotas = [size * w / total for w in exact]
    counts = [math.floor(q) for q in quotas]
    left = size - sum(counts)
    for d in sorted(range(len(quotas)), key=lambda d: (-(quotas[d] - counts[d]), d))[:left]:
        counts[d] += 1
    return counts


def against_largest_remainder(counts: list[int], weights: list[float], size: int) -> dict:
    """How the greedy's samples per dataset differ from the largest remainder's; also how many
    fall below the floor or above the ceiling of their quota."""
    exact = [Fraction(w) for w in weights]
    total = sum(exact)
    quotas = [size * w / total for w in exact]
    hamilton = largest_remainder(weights, size)
    diff = [c - h for c, h in zip(counts, hamilton)]
    differing = [d for d, x in enumerate(diff) if x]
    return {"samples": size, "datasets": len(counts), "counted": int(sum(counts)),
            "datasets_differing": len(differing),
            "max_abs_difference": max((abs(x) for x in diff), default=0),
            "sum_abs_difference": sum(abs(x) for x in diff),
            "below_floor": sum(c < math.floor(q) for c, q in zip(counts, quotas)),
            "above_ceil": sum(c > math.ceil(q) for c, q in zip(counts, quotas)),
            "differences": {str(d): diff[d] for d in differing[:50]}}


def check_blends(cache: str) -> dict[str, dict]:
    """Each BlendedDataset entry of ``cache`` (by split): its dataset_index counted in blocks (the
    train blend's is 2.4 GB at full size) against the largest remainder of its described size by
    its described weights."""
    import numpy as np

    out = {}
    for name in sorted(os.listdir(cache)):
        if "-BlendedDataset-" not in name or not name.endswith("-description.txt"):
            continue
        with open(os.path.join(cache, name)) as f:
            described = json.load(f)
        weights, size = described["weights"], int(described["size"])
        counts = np.zeros(len(weights), dtype=np.int64)
        # read, not memory-mapped: nothing of the file stays resident
        with open(os.path.join(cache, name[: -len("description.txt")] + "dataset_index.npy"), "rb") as f:
            version = np.lib.format.read_magic(f)
            shape, _, dtype = (np.lib.format.read_array_header_1_0 if version == (1, 0)
                               else np.lib.format.read_array_header_2_0)(f)
            while len(block := np.fromfile(f, dtype=dtype, count=COUNT_BLOCK)):
                counts += np.bincount(block, minlength=len(weights))
        if shape != (size,):
            raise BenchmarkFailure(f"{name}: describes {size:,} samples, its dataset_index holds {shape}")
        out[described["split"]] = against_largest_remainder(counts.tolist(), weights, size)
    return out


# ------------------------------------------------------------------------------------------------
# The run


def run(suite_name: str, suite, factor: float, ranks: int, results: str) -> dict:
    """Steps 1 to 6 of the module docstring at ``factor``, megacache at ``ranks``; the record
    appended to ``results``."""
    import numpy as np

    from megacache.algorithms.blend_sizes import normalize
    from megacache.formats.indexed import idx_path, read_layout
    from megacache.builders.blend import BLEND_SAMPLE_BYTES
    from megacache.formats.npy import write_npy

    from . import floor
    from .suite import warm_up
    from .workloads import build_blend

    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    t_run = time.perf_counter()
    machine = machine_info()
    warm_up("build_blend")
    work = tempfile.mkdtemp(prefix="megacache-bench-seed-")
    record: dict = {"benchmark": "seed", "suite": suite_name, "time": started, "factor": factor, "ranks": ranks,
                    "machine": machine}
    try:
        # 1. inputs, once the disk has room for them and (estimated) for the outputs
        documents = expected_documents(suite, factor)
        inputs_bytes = sum(IDX_PER_DOCUMENT * n + IDX_HEADER for n in documents)
        _check_room(work, int(inputs_bytes + estimated_outputs(suite, factor)), "its inputs and outputs (estimated)")
        t = time.perf_counter()
        case = build_blend(work, suite, factor)
        record["prepare_s"] = time.perf_counter() - t
        record["params"] = case.params
        _log(f"seed case: {case.params['datasets']} datasets, {case.params['documents']:,} documents, "
             f"{case.params['tokens']:,} tokens, sizes {case.params['sizes']} (inputs written in "
             f"{record['prepare_s']:.1f} s)")
        planned = planned_outputs(case, work)
        sizes = [read_layout(idx_path(p)).document_count - 1 for p in case.spec["prefixes"]]
        members = choose_members(sizes)
        members_bytes = sum(planned["by_dataset"][case.spec["prefixes"][i]] for i in members)
        floor_bytes = min(FLOOR_MAX, max(FLOOR_MIN, planned["bytes"]))
        # the floor's file is gone before the build starts
        _check_room(work, max(planned["bytes"] + members_bytes, floor_bytes), "the cache (as planned) and "
                    "megatron-core's member entries")
        record["inputs_bytes"] = _allocated(work)
        record["planned_output_bytes"] = planned["bytes"]

        # 2. the disk's own rate
        rate = floor.direct_rates(work, floor_bytes)
        record["disk"] = rate
        if rate is not None:
            _log(f"disk: {rate['bytes'] / 2**30:.2f} GiB O_DIRECT + fsync in {rate['seconds']:.2f} s, "
                 f"{rate['bytes_per_s'] / 1e9:.2f} GB/s; read back (O_DIRECT) in {rate['read_s']:.2f} s, "
                 f"{rate['read_bytes_per_s'] / 1e9:.2f} GB/s")

        # 3. the build
        record["filesystem"] = quiet_filesystem(work)
        cache = os.path.join(work, "cache")
        os.makedirs(cache)
        build = run_program(case.megacache(cache), ranks, work)
        record["build"] = build
        record["outputs"] = describe_outputs(cache)
        written = _written(build)
        record["floor_s"] = written / rate["bytes_per_s"] if rate and None not in build["write_bytes"] else None
        _log(f"build at P = {ranks}: {build['wall_s']:.2f} s, RSS {_gib(build['rss_kb'])} GiB per rank, "
             f"{written / 1e9:.2f} GB written ({record['outputs']['files']:,} files, "
             f"{record['outputs']['bytes'] / 1e9:.2f} GB); phases " + _phases(build["phases"]))

        # 4. megacache verify
        verify = run_program(["megacache", "verify", cache], ranks, work, phases=False)
        record["verify"] = verify
        read = sum(b for b in verify["read_bytes"] if b is not None)
        record["verify_floor_s"] = (read / rate["read_bytes_per_s"] if rate and None not in verify["read_bytes"]
                                    else None)
        _log(f"verify at P = {ranks}: {verify['wall_s']:.2f} s, RSS {_gib(verify['rss_kb'])} GiB per rank")

        # 5. exactness: member datasets by megatron-core, the blends' counts
        theirs = os.path.join(work, "members")
        os.makedirs(theirs)
        spec = os.path.join(work, "members-spec.json")
        with open(spec, "w") as f:
            json.dump(case.spec, f)
        reference = run_program(["benchmarks.reference", "members", spec, theirs, ",".join(map(str, members))],
                                None, work)
        compared = compare_members(cache, theirs)
        record["members"] = {"indices": members, "prefixes": [os.path.basename(case.spec["prefixes"][i])
                                                                for i in members],
                             "documents": [sizes[i] for i in members],
                             "reference": reference, **compared}
        _log(f"members {members} by megatron-core in {reference['wall_s']:.1f} s: {compared['files']} files, "
             f"{compared['bytes'] / 1e6:.1f} MB, " + ("identical" if compared["identical"] else
                                                     f"missing {compared['missing']}, differ {compared['differ']}"))
        t = time.perf_counter()
        record["blends"] = check_blends(cache)
        record["blends_checked_s"] = time.perf_counter() - t
        for split, c in record["blends"].items():
            _log(f"{split} blend: {c['samples']:,} samples; {c['datasets_differing']} of {c['datasets']} datasets "
                 f"differ from the largest remainder (at most {c['max_abs_difference']}, {c['sum_abs_difference']} "
                 f"in all; {c['below_floor']} below their quota's floor, {c['above_ceil']} above its ceiling)")
        shutil.rmtree(cache)  # room for what follows, and nothing of its pages left dirty
        shutil.rmtree(theirs)

        # 6. the seed's blend alone
        size = max(BLEND_MIN, int(BLEND_SAMPLES * factor / 100))
        weights = normalize(normalize(np.random.default_rng(0).random(BLEND_DATASETS)))
        weights_path, counts_path = os.path.join(work, "weights.npy"), os.path.join(work, "blend-counts.npy")
        out = os.path.join(work, "blend")
        write_npy(weights_path, weights)
        os.makedirs(out)
        _check_room(work, size * BLEND_SAMPLE_BYTES, "the blend's arrays")
        blend = run_program(["benchmarks.kernel", weights_path, str(size), out, counts_path], ranks, work)
        counts = np.load(counts_path)
        shutil.rmtree(out)
        record["blend_alone"] = {"samples": size, "datasets": BLEND_DATASETS, "weights": "uniform random, seed 0",
                                 "output": "written and made durable as a build writes a blend's arrays "
                                           "(benchmarks.kernel, through BlendFiles), then removed",
                                 "run": blend, "vs_largest_remainder": against_largest_remainder(
                                     counts.tolist(), weights.tolist(), size),
                                 "seed_claims": SEED_CLAIMS}
        _log(f"blend alone: {size:,} samples x {BLEND_DATASETS} datasets at P = {ranks}: {blend['wall_s']:.2f} s "
             f"(phases {_phases(blend['phases'])}); {_claims(SEED_CLAIMS)}")
    finally:
        shutil.rmtree(work, ignore_errors=True)
    record["seconds"] = time.perf_counter() - t_run
    record["loadavg_after"] = list(os.getloadavg())
    append_record(results, record)
    if not record["members"]["identical"]:
        raise BenchmarkFailure(f"megacache's entries of member datasets {members} differ from megatron-core's: "
                               f"missing {record['members']['missing']}, differ {record['members']['differ']} "
                               f"(record appended to {shown(results)}; the work directory is removed, too large "
                               f"to keep)")
    return record


def _allocated(directory: str) -> int:
    """Bytes the files under ``directory`` hold on disk (sparse ``.bin`` files hold none)."""
    total = 0
    for base, _, names in os.walk(directory):
        for n in names:
            total += os.lstat(os.path.join(base, n)).st_blocks * 512
    return total


def _gib(rss_kb: list[int]) -> str:
    return "/".join(f"{r / 2**20:.2f}" for r in rss_kb)


def _phases(phases: dict[str, float]) -> str:
    return ", ".join(f"{k} {v:.2f}" for k, v in phases.items())


# ------------------------------------------------------------------------------------------------
# The report


def _claims(claims: dict) -> str:
    """The seed's own figures for its blend, as recorded."""
    return (f"The seed at {int(claims['samples']):,} samples: {claims['seed_s']:.0f} s, "
            f"{'exact' if claims['seed_exact'] else 'inexact'}; Megatron {claims['megatron_s'] / 60:.0f} min")


def load_seed_records(path: str) -> list[dict]:
    with open(path) as f:
        return [r for r in map(json.loads, filter(str.strip, f)) if r.get("benchmark") == "seed"]


def latest(records: list[dict]) -> dict | None:
    """The last record of the largest factor."""
    best = None
    for r in records:
        if best is None or r["factor"] >= best["factor"]:
            best = r
    return best


def table(record: dict) -> str:
    """The run as markdown: its size, then one row per measurement."""
    p, b = record["params"], record["build"]
    out, disk, members = record["outputs"], record["disk"], record["members"]
    written = _written(b)
    blend = record["blend_alone"]
    lr = blend["vs_largest_remainder"]
    ranks = record["ranks"]
    rows = [
        f"`python -m benchmarks run --suite {record['suite']} --factor {record['factor']:g}` "
        f"({record['time']}, {record['machine']['cpus_usable']} cores, {record['machine']['ram_gib']:.0f} GiB, "
        f"commit {(record['machine'].get('git_commit') or '?')[:7]}; `benchmarks/results/seed.jsonl`): "
        f"{p['datasets']:,} datasets, {p['documents']:,} documents of {p['mean_length']:,.0f} tokens on average, "
        f"{p['tokens']:,} tokens, L = {p['seq_length']}, split \"{p['split']}\", sizes {p['sizes']}, surplus "
        f"{p['mid_level_dataset_surplus']:g}; inputs {record['inputs_bytes'] / 1e9:.2f} GB on disk.",
        "",
        "| measurement | result |",
        "|---|---|",
        f"| `megacache build`, P = {ranks} | {b['wall_s']:.1f} s wall, peak RSS per rank "
        f"{' / '.join(f'{r / 2**20:.2f}' for r in b['rss_kb'])} GiB, CPU {sum(b['cpu_s']):.1f} s (both ranks), "
        f"{written / 1e9:.2f} GB written; {out['files']:,} files, {out['bytes'] / 1e9:.2f} GB |",
        f"| its phases (s) | {_phases(b['phases'])} |",
    ]
    if disk is not None:
        rows.append(f"| the disk alone (O_DIRECT + fsync, {disk['bytes'] / 2**30:.2f} GiB) | "
                    f"{disk['bytes_per_s'] / 1e9:.2f} GB/s: the build's {written / 1e9:.2f} GB take "
                    f"{record['floor_s']:.1f} s ({record['floor_s'] / b['wall_s']:.0%} of the build) |")
    v = record["verify"]
    read = ""
    if record.get("verify_floor_s") is not None:  # records before reads were measured have none
        read = (f"; {sum(v['read_bytes']) / 1e9:.2f} GB read from the disk (the rest from the page cache), "
                f"{record['verify_floor_s']:.1f} s at its O_DIRECT read rate of "
                f"{disk['read_bytes_per_s'] / 1e9:.2f} GB/s")
    rows.append(f"| `mpiexec -n {ranks} megacache verify` of the cache | {v['wall_s']:.1f} s wall, peak RSS per "
                f"rank {' / '.join(f'{r / 2**20:.2f}' for r in v['rss_kb'])} GiB{read} |")
    rows.append(f"| member datasets by megatron-core 0.16.1 alone (indices {members['indices']}: "
                f"{', '.join(f'{d:,}' for d in members['documents'])} documents) | {members['files']} files, "
                f"{members['bytes'] / 1e6:,.1f} MB: "
                + ("byte-identical to megacache's" if members["identical"] else
                   f"**differ**: {members['differ'] + members['missing']}")
                + f" (megatron-core {members['reference']['wall_s']:.1f} s) |")
    for split, c in sorted(record["blends"].items(), key=lambda item: SPLITS.index(item[0])):
        rows.append(f"| {split} blend's samples per dataset against the exact largest remainder | "
                    f"{c['samples']:,} samples: {c['datasets_differing']} of {c['datasets']} datasets differ, by at "
                    f"most {c['max_abs_difference']} ({c['sum_abs_difference']} in all); {c['below_floor']} below "
                    f"the floor of their quota, {c['above_ceil']} above its ceiling |")
    run = blend["run"]
    rows.append(f"| the seed's blend alone: {blend['samples']:,} samples x {blend['datasets']} datasets, "
                f"uniform random weights (seed 0), P = {ranks}, exact, output {blend['output']} | {run['wall_s']:.1f} "
                f"s wall ({_phases(run['phases'])}), peak RSS per rank "
                f"{' / '.join(f'{r / 2**20:.2f}' for r in run['rss_kb'])} GiB; against the largest remainder "
                f"{lr['datasets_differing']} datasets differ, by at most {lr['max_abs_difference']}. "
                f"{_claims(blend['seed_claims'])} |")
    return "\n".join(rows) + "\n"


def growth(records: list[dict]) -> str:
    """The build at each factor run (the latest record of each) in one table, then how its time,
    bytes and memory grow from the smallest factor to the largest; empty with fewer than two."""
    by_factor = {r["factor"]: r for r in records}  # records are in time order: the last one stays
    if len(by_factor) < 2:
        return ""
    rows = ["The build at each factor run, from the latest record of each (the disk's floor and the "
            "build's ratio to it measured in the same run):", "",
            "| factor | tokens | documents | train samples | build, P | the disk's floor | CPU, all ranks | "
            "written | peak RSS per rank | run, commit |",
            "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for factor in sorted(by_factor):
        r = by_factor[factor]
        p, b = r["params"], r["build"]
        floor = f"{r['floor_s']:.1f} s ({b['wall_s'] / r['floor_s']:.2f}x)" if r.get("floor_s") else "not measured"
        rows.append(f"| {factor:g} | {p['tokens']:.2e} | {p['documents']:.2e} | {p['sizes'][0]:.2e} | "
                    f"{b['wall_s']:.1f} s, {r['ranks']} | {floor} | {sum(b['cpu_s']):.1f} s | "
                    f"{_written(b) / 1e9:.2f} GB | {_gib(b['rss_kb'])} GiB | {r['time']}, "
                    f"{(r['machine'].get('git_commit') or '?')[:7]} |")
    small, large = by_factor[min(by_factor)], by_factor[max(by_factor)]
    tokens = large["params"]["tokens"] / small["params"]["tokens"]
    time_ratio = large["build"]["wall_s"] / small["build"]["wall_s"]
    rows += ["", f"From factor {small['factor']:g} to {large['factor']:g} ({tokens:.1f}x the tokens): time "
             f"{time_ratio:.1f}x (b = {math.log(time_ratio) / math.log(tokens):.2f} in time = a · tokens^b), bytes "
             f"written {_written(large['build']) / _written(small['build']):.1f}x, peak RSS per rank "
             f"{max(large['build']['rss_kb']) / max(small['build']['rss_kb']):.2f}x."]
    return "\n".join(rows) + "\n"


def _written(build: dict) -> int:
    return sum(x for x in build["write_bytes"] if x is not None)


SEED_START, SEED_END = "<!-- seed table: start -->", "<!-- seed table: end -->"


def write_report(results: str, doc: str | None = None) -> list[str]:
    """``SEED.md`` beside ``results`` from its latest record of the largest factor and the growth
    over the factors run, and the same between the seed markers of ``doc``."""
    records = load_seed_records(results)
    record = latest(records)
    if record is None:
        raise SystemExit(f"{results}: no seed records; run `python -m benchmarks run --suite seed` first")
    body = table(record)
    grown = growth(records)
    if grown:
        body += "\n" + grown
    path = os.path.join(os.path.dirname(os.path.abspath(results)), "SEED.md")
    with open(path, "w") as f:
        f.write(f"# The seed's case\n\n<!-- written by `python -m benchmarks.seed report` from {shown(results)} "
                f"-->\n\n{body}")
    written = [shown(path)]
    if doc is not None:
        with open(doc) as f:
            text = f.read()
        a, b = text.find(SEED_START), text.find(SEED_END)
        if a < 0 or b < a:
            raise SystemExit(f"{doc}: no {SEED_START} ... {SEED_END} markers")
        block = (f"{SEED_START}\n<!-- written by `python -m benchmarks.seed report --doc` from "
                 f"{shown(results)}; edits here are overwritten -->\n\n{body}")
        with open(doc, "w") as f:
            f.write(text[:a] + block + text[b:])
        written.append(shown(doc))
    return written


def main(argv: list[str]) -> None:
    if argv[:1] == ["report"]:
        import argparse

        ap = argparse.ArgumentParser(prog="python -m benchmarks.seed report")
        ap.add_argument("--results", default=SEED_RESULTS)
        ap.add_argument("--doc", metavar="PATH", help="also rewrite the seed table between the seed markers of "
                                                      "this Markdown file (docs/benchmarks.md)")
        args = ap.parse_args(argv[1:])
        print("wrote " + ", ".join(write_report(args.results, args.doc)))
    else:
        sys.exit("usage: python -m benchmarks.seed report [--results FILE] [--doc FILE]")


if __name__ == "__main__":
    main(sys.argv[1:])
