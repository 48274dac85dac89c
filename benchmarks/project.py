"""A projection of the cache build for 5e12 tokens in 1000 datasets at L = 4096 on P = 64, 512
and 4096 ranks, and of megatron-core's one-rank build of the same, from the phase costs measured
by the suite (``build_gpt``: one dataset; ``build_blend``: 1000 datasets; ``blend_kernel``) plus
the filesystem assumptions below, written as a short markdown document.

Every per-unit constant is a phase's median seconds at the smallest P, divided by what the phase
scales with (documents, document-index entries, sample rows, blend samples, files, datasets).
Where a phase has both a per-dataset and a per-element part, the one-dataset and the 1000-dataset
builds give two equations for the two constants.

With a record of the seed suite (``seed.py``: the 1000-dataset build at 5e12 tokens, documents of
10,000 tokens, at P = 2, no megatron-core beside it), megacache's 1000-dataset constants come from
its build, the blend's from its 2e9-sample blend alone, and the case projected is the seed's: its
measured counts (document-index entries, sample rows, shuffle entries, blend samples, files and
bytes), scaled to 5e12 tokens when the run was smaller. megatron-core's constants still come from
the scale suite's build, the largest beside it."""

from __future__ import annotations

import math
import os

from .harness import latest_per_workload, load_records, shown
from .workloads import MEAN_LENGTH, SEQ_LENGTH, blend_shares

#: the seed suite's factor at the seed's case (5e12 tokens)
SEED_FACTOR = 100.0

TOKENS = 5e12
DATASETS = 1000
RANKS = (64, 512, 4096)
SPLITS = 3
# Not measured here: what a cluster's shared filesystem and launcher cost.
ASSUMED = {
    "startup_s": 30.0,          # launching P ranks and importing Python + numba kernels from a shared filesystem
    "write_gb_s": 10.0,         # aggregate write bandwidth of the shared filesystem
    "client_gb_s": 1.0,         # one rank's (client's) write bandwidth
    "file_s": 0.005,            # one file's create + fsync + rename, from one client
    "metadata_ops_s": 20000.0,  # the metadata servers' file operations per second, all clients together
}


def _fit(x_one: float, x_many: float, per_dataset: tuple[float, float], per_element: tuple[float, float]):
    """(seconds per dataset, seconds per element) from the one-dataset and the many-dataset
    builds; a negative constant (noise) is dropped and the other taken from one build alone."""
    (d1, d2), (n1, n2) = per_dataset, per_element
    det = d1 * n2 - d2 * n1
    alpha = (x_one * n2 - x_many * n1) / det
    beta = (d1 * x_many - d2 * x_one) / det
    if alpha < 0:
        return 0.0, x_one / n1
    if beta < 0:
        return x_many / d2, 0.0
    return alpha, beta


def _counts(record: dict) -> dict[str, float]:
    arrays, p = record["outputs"]["arrays"], record["params"]
    return {"datasets": p["datasets"], "documents": p["documents"],
            "doc_entries": arrays["document_index"]["elements"],
            "sample_rows": arrays["sample_index"]["elements"] / 2,  # (rows, 2): document and offset
            "shuffle": arrays["shuffle_index"]["elements"],
            "blend": arrays.get("dataset_index", {}).get("elements", 0),
            "files": record["outputs"]["files"]}


def _base_ranks(record: dict) -> int:
    return min(int(p) for p in record["megacache"])


def _base(record: dict, side: str) -> dict:
    """The medians of the reference, or of megacache at its smallest P."""
    if side == "reference":
        return record["reference"]["median"]
    return record["megacache"][str(_base_ranks(record))]["median"]


def seed_as_build(seed: dict) -> dict:
    """A seed suite record in the shape of a suite record's megacache side (its one build at P)."""
    return {**seed, "workload": "build_blend", "megacache": {str(seed["ranks"]): {"median": seed["build"]}}}


def constants(gpt: dict, blend: dict, kernel: dict, seed: dict | None = None) -> dict[str, dict[str, float]]:
    """Seconds per unit for both sides, and bytes per element of each array. A megacache phase
    measured at P > 1 did 1/P of the elements on each rank (and, where the work is spread by
    dataset, 1/P of the datasets): the counts are divided accordingly. With a seed record,
    megacache's many-dataset build is the seed's and its blend constants its blend alone's."""
    many = {"megacache": seed_as_build(seed) if seed is not None else blend, "reference": blend}
    g = _counts(gpt)
    pg = _base_ranks(gpt)

    def fit(side: str, phase: str, element: str, spread_datasets: bool):
        b = _counts(many[side])
        qg, qb = (pg, _base_ranks(many[side])) if side == "megacache" else (1, 1)
        ds = (g["datasets"] / (qg if spread_datasets else 1), b["datasets"] / (qb if spread_datasets else 1))
        return _fit(_base(gpt, side)["phases"].get(phase, 0.0), _base(many[side], side)["phases"].get(phase, 0.0),
                    ds, (g[element] / qg, b[element] / qb))

    ours, ref = {}, {}
    ours["plan_dataset"], ours["plan_document"] = fit("megacache", "plan", "documents", False)
    ours["doc_dataset"], ours["doc_entry"] = fit("megacache", "document_index", "doc_entries", True)
    ours["sample_dataset"], ours["sample_row"] = fit("megacache", "sample_index", "sample_rows", False)
    # The shuffle runs on its owner's thread beside the sample index and is seen only as the wait
    # after it: at most the two together, per shuffle entry of the one-dataset build.
    gp = _base(gpt, "megacache")["phases"]
    ours["shuffle_entry_max"] = (gp["sample_index"] + gp.get("shuffle_index_wait", 0.0)) / (g["shuffle"] / pg)
    mb, pb = many["megacache"], _base_ranks(many["megacache"])
    ours["publish_file"] = _base(mb, "megacache")["phases"]["publish"] / (_counts(mb)["files"] / pb)
    if seed is not None:  # the seed's blend alone: P chunks of samples / P
        alone = seed["blend_alone"]
        k1, p_max = alone["run"]["phases"], seed["ranks"]
        ours["blend_sample"] = k1["blend"] / (alone["samples"] / p_max)
        repair = k1["repair"]
    else:
        ks = kernel["megacache"]
        k1 = _base(kernel, "megacache")["phases"]
        ours["blend_sample"] = k1["blend"] / kernel["params"]["samples"]
        p_max = max(int(p) for p in ks)
        repair = ks[str(p_max)]["median"]["phases"]["repair"]
    # A chunk's repair: the measured repair phase over the chunks after the first (every guess
    # assumed wrong). Repairs run in rounds, all chunks at once; one round usually confirms them all.
    ours["repair_chunk_max"] = repair / (p_max - 1) if p_max > 1 else 0.0
    ours["startup_here"] = _base(gpt, "megacache")["phases"]["other"]

    ref["load_dataset"], ref["load_document"] = fit("reference", "load", "documents", False)
    ref["doc_dataset"], ref["doc_entry"] = fit("reference", "document_index", "doc_entries", False)
    ref["sample_dataset"], ref["sample_row"] = fit("reference", "sample_index", "sample_rows", False)
    ref["shuffle_dataset"], ref["shuffle_entry"] = fit("reference", "shuffle_index", "shuffle", False)
    ref["other_dataset"] = _base(blend, "reference")["phases"]["build_other"] / _counts(blend)["datasets"]
    ref["save_byte"] = (_base(blend, "reference")["phases"]["save"] / blend["outputs"]["bytes"])
    ref["blend_sample"] = _base(kernel, "reference")["phases"]["blend"] / kernel["params"]["samples"]
    rp = _base(gpt, "reference")["phases"]
    ref["startup"] = rp["import"] + rp["setup"] + rp["other"]

    arrays = {**gpt["outputs"]["arrays"], **blend["outputs"]["arrays"], **(seed["outputs"]["arrays"] if seed else {})}
    size = {k: v["bytes"] / v["elements"] for k, v in arrays.items()}
    return {"megacache": ours, "reference": ref, "bytes_per_element": size}


def target(seed: dict | None = None) -> dict[str, float]:
    """The case: weights follow the datasets' sizes, so the blend reads every dataset about once
    (one epoch); the datasets' shares are the benchmark's lognormal ones. With a seed record, the
    seed's case as that run built it: its counts and bytes, times SEED_FACTOR / its factor."""
    share, _ = blend_shares(DATASETS)
    if seed is not None:
        scale = SEED_FACTOR / seed["factor"]
        c = _counts(seed_as_build(seed))
        return {"datasets": c["datasets"], "documents": c["documents"] * scale,
                "doc_entries": c["doc_entries"] * scale, "sample_rows": c["sample_rows"] * scale,
                "shuffle": c["shuffle"] * scale, "blend": c["blend"] * scale, "largest_share": float(share.max()),
                "files": c["files"], "mean_length": seed["params"]["mean_length"],
                "train_samples": seed["params"]["sizes"][0] * scale, "bytes": seed["outputs"]["bytes"] * scale}
    samples = TOKENS / SEQ_LENGTH
    documents = TOKENS / MEAN_LENGTH
    return {"datasets": DATASETS, "documents": documents, "doc_entries": documents, "sample_rows": samples,
            "shuffle": samples, "blend": samples, "largest_share": float(share.max()),
            "files": DATASETS * SPLITS * 4 + SPLITS * 3, "mean_length": MEAN_LENGTH, "train_samples": samples}


def _bytes(t: dict, size: dict) -> float:
    return (t["doc_entries"] * size["document_index"] + t["sample_rows"] * 2 * size["sample_index"]
            + t["shuffle"] * size["shuffle_index"]
            + t["blend"] * (size["dataset_index"] + size["dataset_sample_index"]))


def predict_megacache(c: dict, t: dict, p: int, total_bytes: float) -> dict[str, float]:
    """Phase seconds on the critical path at P ranks (the blend and the shuffles run on
    background threads: only what outlasts the work beside them counts)."""
    m, a = c, ASSUMED
    jobs = t["datasets"] * SPLITS
    plan = m["plan_dataset"] * t["datasets"] + m["plan_document"] * t["documents"] / p
    doc = max(m["doc_dataset"] * t["datasets"] / p + m["doc_entry"] * t["doc_entries"] / p,
              m["doc_entry"] * t["doc_entries"] * t["largest_share"])  # a job is one rank's
    sample = m["sample_dataset"] * t["datasets"] + m["sample_row"] * t["sample_rows"] / p
    shuffle = max(0.0, m["shuffle_entry_max"] * max(t["shuffle"] / p, t["shuffle"] * t["largest_share"]) - sample)
    blend = m["blend_sample"] * t["blend"] / p + m["repair_chunk_max"]  # one repair round
    blend_wait = max(0.0, blend - (doc + sample + shuffle))
    files_per_rank = math.ceil(jobs / p) * 4 + SPLITS * 3  # rank 0 also publishes the blends
    publish = max(files_per_rank * a["file_s"], 3 * t["files"] / a["metadata_ops_s"])
    write = total_bytes / (1e9 * min(a["write_gb_s"], p * a["client_gb_s"]))
    compute = plan + doc + sample + shuffle + blend_wait
    return {"start-up (assumed)": a["startup_s"], "plan": plan, "document_index": doc, "sample_index": sample,
            "shuffle_index_wait": shuffle, "blend_wait": blend_wait,
            "writing (bandwidth bound beyond compute)": max(0.0, write - compute), "publish": publish}


def predict_reference(c: dict, t: dict, total_bytes: float) -> dict[str, float]:
    r, a = c, ASSUMED
    save = max(r["save_byte"] * total_bytes, total_bytes / (1e9 * a["client_gb_s"]))
    return {"start-up (measured here)": r["startup"],
            "load": r["load_dataset"] * t["datasets"] + r["load_document"] * t["documents"],
            "document_index": r["doc_dataset"] * t["datasets"] + r["doc_entry"] * t["doc_entries"],
            "sample_index": r["sample_dataset"] * t["datasets"] + r["sample_row"] * t["sample_rows"],
            "shuffle_index": r["shuffle_dataset"] * t["datasets"] + r["shuffle_entry"] * t["shuffle"],
            "blend": r["blend_sample"] * t["blend"],
            "save": save, "files": t["files"] * a["file_s"],
            "build_other": r["other_dataset"] * t["datasets"]}


def _fmt(seconds: float) -> str:
    if seconds >= 3600:
        return f"{seconds / 3600:.1f} h"
    if seconds >= 60:
        return f"{seconds / 60:.1f} min"
    return f"{seconds:.2g} s" if seconds < 10 else f"{seconds:.0f} s"


def ns(seconds: float) -> str:
    """A small per-unit cost in the unit that reads best."""
    for unit, scale in (("s", 1.0), ("ms", 1e-3), ("µs", 1e-6)):
        if seconds >= scale:
            return f"{seconds / scale:.3g} {unit}"
    return f"{seconds * 1e9:.3g} ns"


def _e(x: float, digits: int = 2) -> str:
    """5e12 rather than 5e+12."""
    mantissa, exponent = f"{x:.{digits}e}".split("e")
    return f"{mantissa.rstrip('0').rstrip('.')}e{int(exponent)}"


def _source(r: dict) -> str:
    return f"`{r['workload']}` ({r['suite']} suite, factor {r['factor']:g}, {r['time']})"


def _seed_source(r: dict) -> str:
    return f"{r['suite']} suite, factor {r['factor']:g}, {r['time']}"


def document(records: dict[str, dict], sources: str) -> str:
    gpt, blend, kernel = records["build_gpt"], records["build_blend"], records["blend_kernel"]
    seed = records.get("seed")
    c = constants(gpt, blend, kernel, seed)
    t = target(seed)
    total = t["bytes"] if seed is not None else _bytes(t, c["bytes_per_element"])
    ours = {p: predict_megacache(c["megacache"], t, p, total) for p in RANKS}
    ref = predict_reference(c["reference"], t, total)
    m, r = c["megacache"], c["reference"]
    machine = gpt["machine"]
    lines = [
        f"# Projection: building the cache for {_e(TOKENS)} tokens",
        "",
        f"<!-- written by `python -m benchmarks project` from {sources}; rerun it after "
        "`python -m benchmarks run --suite full`, `--suite scale` or `--suite seed` -->",
        "",
    ]
    if seed is None:
        lines += [
            f"The case: {_e(TOKENS)} tokens in {DATASETS} datasets (the benchmark's lognormal sizes: the largest "
            f"holds {t['largest_share']:.2%}), documents of {MEAN_LENGTH:.0f} tokens on average "
            f"({_e(t['documents'])}), L = {SEQ_LENGTH}, one epoch: {_e(t['sample_rows'], 3)} train samples blended "
            f"by weights that follow the sizes; {t['files']:,} cache files, {total / 1e9:.0f} GB (bytes per entry as "
            "measured).",
            "",
            f"Constants are one rank's, measured on this machine ({machine['cpu']}, {machine['cpus_usable']} cores, "
            f"local ext4) from {_source(gpt)}, {_source(blend)} and {_source(kernel)}: medians at the smallest P, "
            "divided by what each phase scales with (per rank, at that P).",
            "",
        ]
    else:
        scale = SEED_FACTOR / seed["factor"]
        b = seed["build"]
        lines += [
            f"The case: the seed's (issue 41), {_e(seed['params']['tokens'] * scale)} tokens in {t['datasets']} "
            f"datasets (the benchmark's "
            f"lognormal sizes: the largest holds {t['largest_share']:.2%}), documents of "
            f"{t['mean_length']:,.0f} tokens on average ({_e(t['documents'])}), L = {SEQ_LENGTH}, "
            f"{_e(t['train_samples'], 3)} train samples in a weighted blend: as the seed suite built it "
            f"({_seed_source(seed)}"
            + (f", its counts times {scale:g}" if scale != 1 else "")
            + f"): {_e(t['doc_entries'], 3)} document-index entries, {_e(t['sample_rows'], 3)} sample rows, "
            f"{_e(t['shuffle'], 3)} shuffle entries, {_e(t['blend'], 3)} blend samples; {t['files']:,} cache files, "
            f"{total / 1e9:.0f} GB.",
            "",
            f"That run, megacache at P = {seed['ranks']} on this machine: {b['wall_s']:.1f} s wall, phases "
            + ", ".join(f"{k} {v:.2f} s" for k, v in b["phases"].items())
            + f"; peak RSS per rank {' / '.join(f'{x / 2**20:.2f}' for x in b['rss_kb'])} GiB.",
            "",
            f"Constants are one rank's, measured on this machine ({machine['cpu']}, {machine['cpus_usable']} cores, "
            f"local ext4): megacache's from {_source(gpt)} and that seed run's build and its blend alone "
            f"({seed['blend_alone']['samples']:,} samples); megatron-core's from {_source(gpt)}, {_source(blend)} "
            f"and {_source(kernel)}: medians at the smallest P, divided by what each phase scales with (per rank, "
            "at that P).",
            "",
        ]
        if scale != 1:
            lines += [f"**The seed run was at factor {seed['factor']:g}, 1/{scale:g} of the seed's case: its fixed "
                      "costs weigh more than at full size, so the constants, and the times below, are too high. "
                      "Regenerate after `python -m benchmarks run --suite seed`.**", ""]
    small = sorted({r["factor"] for r in (gpt, blend, kernel) if r["factor"] < 1})
    if small:
        lines += [f"**Measured at factor {', '.join(f'{f:g}' for f in small)}, not the issue's sizes: fixed costs "
                  "(loading numba kernels, opening files) dominate runs this small and inflate every per-unit "
                  "constant, so the times below are far too high. Regenerate after the full suite.**", ""]
    lines += [
        "## Model (megacache, P ranks)",
        "",
        "| phase | scales as | measured constant |",
        "|---|---|---|",
        f"| plan | each dataset surveyed by one rank (opened, three index entries read per split; no "
        f"lengths), then every rank plans every entry from the surveys: O(datasets), not O(documents); "
        f"taken whole at every P (the survey's share, 1 / P of it, is not separated) "
        f"| {ns(m['plan_dataset'])}/dataset, {ns(m['plan_document'])}/document |",
        f"| document_index | per job on its owner, its lengths read there: max(entries / P, largest job) | "
        f"{ns(m['doc_dataset'])}/dataset, {ns(m['doc_entry'])}/entry |",
        f"| sample_index | large jobs cut evenly: O(samples / P); a small job's is part of its document_index "
        f"phase on its owner (in the blend build all are small, so this constant is the one dataset's) "
        f"| {ns(m['sample_dataset'])}/dataset, "
        f"{ns(m['sample_row'])}/sample |",
        f"| shuffle_index_wait | per job on its owner's thread, beside the sample index | at most "
        f"{ns(m['shuffle_entry_max'])}/entry |",
        f"| blend_wait | chunked: O(samples / P) + one round of repairs (every wrong chunk guess at once), on a "
        f"thread | {ns(m['blend_sample'])}/sample; at most {ns(m['repair_chunk_max'])} per round |",
        f"| publish | per file, by each job's owner; blends on rank 0 | {ns(m['publish_file'])}/file "
        f"here; assumed {ASSUMED['file_s'] * 1e3:g} ms on a shared filesystem |",
        f"| writing | {total / 1e9:.0f} GB at min({ASSUMED['write_gb_s']:g} GB/s, P x {ASSUMED['client_gb_s']:g} GB/s), "
        "overlapping the compute | assumed |",
        f"| start-up | launcher, interpreter, imports | {m['startup_here']:.2g} s here (one rank); assumed "
        f"{ASSUMED['startup_s']:g} s at scale |",
        "",
        "## Predicted wall time",
        "",
        "| phase | " + " | ".join(f"P = {p}" for p in RANKS) + " |",
        "|---|" + "---:|" * len(RANKS),
    ]
    for phase in ours[RANKS[0]]:
        lines.append(f"| {phase} | " + " | ".join(_fmt(ours[p][phase]) for p in RANKS) + " |")
    lines.append("| **total** | " + " | ".join(f"**{_fmt(sum(ours[p].values()))}**" for p in RANKS) + " |")
    lines.append("| dominating | " + " | ".join(max(ours[p], key=ours[p].get) for p in RANKS) + " |")
    ref_total = sum(ref.values())
    lines += [
        "",
        "Critical path: start-up → plan → document indices (the largest job bounds it once P exceeds "
        f"1/{t['largest_share']:.3f} ≈ {1 / t['largest_share']:.0f}) → sample indices → waiting for the "
        "shuffles and the blend (threads that ran beside them) → publish; writing overlaps the compute and "
        "counts only where the filesystem is slower.",
        "",
        "## megatron-core, one rank (rank 0 builds, every GPU waits)",
        "",
        "Extrapolated from its measured costs: "
        f"{ns(r['load_dataset'])}/dataset + {ns(r['load_document'])}/document to load, "
        f"{ns(r['doc_entry'])}/document-index entry, {ns(r['sample_row'])}/sample row, "
        f"{ns(r['shuffle_entry'])}/shuffle entry, {ns(r['blend_sample'])}/blend sample (`build_blending_indices`), "
        f"{ns(r['other_dataset'])}/dataset of other work; writes from one client at most "
        f"{ASSUMED['client_gb_s']:g} GB/s, {ASSUMED['file_s'] * 1e3:g} ms per file.",
        "",
        "| phase | predicted |",
        "|---|---:|",
        *(f"| {k} | {_fmt(v)} |" for k, v in ref.items()),
        f"| **total** | **{_fmt(ref_total)}** |",
        "",
        "Against it: " + "; ".join(f"P = {p}: {ref_total / sum(ours[p].values()):.0f}x" for p in RANKS) + ".",
        "",
        "## Caveats",
        "",
        "- Constants come from a small VM; a cluster core is usually faster, a shared filesystem slower than "
        "local ext4. The assumptions (start-up, bandwidth, per-file cost, metadata rate) are not measured; "
        "at large P they, not the computation, decide the total.",
        "- The shuffle and repair costs are upper bounds (a thread's cost is only seen when it outlasts the "
        "work beside it; every chunk guess is assumed wrong). Measured ranks here share 2 cores, so costs at "
        "P > 2 include waiting for a core.",
        "- Collective latency (a few allgathers per phase) and memory are not modelled; megatron-core also "
        f"holds the whole blend in memory ({t['blend'] * (c['bytes_per_element']['dataset_index'] + c['bytes_per_element']['dataset_sample_index']) / 1e9:.0f} GB).",
    ]
    tok = records.get("tokenize")
    if tok is not None:
        base = _base(tok, "megacache")
        per_token = base["cpu_s"] / (tok["outputs"]["bytes_by_suffix"][".bin"] / 2)
        lines.append(f"- Tokenizing the {_e(TOKENS)} tokens first is another job: at the CPU per token measured by "
                     f"{_source(tok)} ({ns(per_token)}), {TOKENS * per_token / 3600:,.0f} core-hours, "
                     "split evenly over the ranks (input units), reading and writing aside.")
    return "\n".join(lines) + "\n"


def write_projection(results: str, output: str, suite: str | None = None, scale_results: str | None = None,
                     seed_results: str | None = None) -> None:
    records = latest_per_workload(load_records(results), suite, prefer_large=True)
    sources = shown(results)
    if scale_results and os.path.exists(scale_results):
        # the 1000-dataset build at its largest measured size
        records.update(latest_per_workload([r for r in load_records(scale_results) if r["workload"] == "build_blend"],
                                           prefer_large=True))
        sources += f" and {shown(scale_results)}"
    if seed_results and os.path.exists(seed_results):
        from .seed import latest, load_seed_records

        seed = latest(load_seed_records(seed_results))  # the largest factor's last
        if seed is not None:
            records["seed"] = seed
            sources += f" and {shown(seed_results)}"
    missing = [w for w in ("build_gpt", "build_blend", "blend_kernel") if w not in records]
    if missing:
        raise SystemExit(f"{results}: no records of {', '.join(missing)}; run `python -m benchmarks run` first")
    os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
    with open(output, "w") as f:
        f.write(document(records, sources))
