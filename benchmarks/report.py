"""Plots and a markdown table from the results file alone, written next to it: ``speedup.png``
(speed-up against P per workload, from wall time and from the busiest rank's CPU time),
``phases.png`` (each side's phases stacked, per P), ``vs_megatron.png`` (wall times against the
reference) and ``TABLE.md``. Each workload's latest record is shown (of one suite if asked).
``SCALE.md``: one workload measured at several sizes (the scale suite), with its fitted growth."""

from __future__ import annotations

import os

from .harness import OTHER, latest_per_workload, load_records, shown
from .workloads import WORKLOADS

ORDER = list(WORKLOADS)


def _selected(results: str, suite: str | None) -> list[dict]:
    chosen = latest_per_workload(load_records(results), suite)
    if not chosen:
        raise SystemExit(f"{results}: no suite records{f' of suite {suite!r}' if suite else ''}; "
                         "run `python -m benchmarks run` first")
    return [chosen[w] for w in ORDER if w in chosen]


def _ranks(record: dict) -> list[int]:
    return sorted(int(p) for p in record["megacache"])


def _title(record: dict) -> str:
    return f"{record['workload']} (factor {record['factor']:g})"


# ------------------------------------------------------------------------------------------------
# Plots


def _figure(n: int, height: float = 3.6):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, n, figsize=(4.2 * n, height), squeeze=False)
    return plt, fig, axes[0]


def plot_speedup(records: list[dict], path: str) -> None:
    plt, fig, axes = _figure(len(records))
    for ax, r in zip(axes, records):
        ranks = _ranks(r)
        s = [r["megacache"][str(p)]["median"]["scaling"] for p in ranks]
        ax.plot(ranks, [p / ranks[0] for p in ranks], ":", color="grey", label="ideal")
        ax.plot(ranks, [x["speedup_wall"] for x in s], "o-", label="wall time")
        ax.plot(ranks, [x["speedup_cpu"] for x in s], "s--", label="busiest rank's CPU")
        ax.axvline(r["machine"]["cpus_usable"], color="red", lw=0.8, alpha=0.5, label="cores here")
        ax.set_xscale("log", base=2)
        ax.set_xticks(ranks, [str(p) for p in ranks])
        ax.set_xlabel("ranks P")
        ax.set_title(_title(r), fontsize=10)
    axes[0].set_ylabel(f"speed-up vs P={_ranks(records[0])[0]}")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_phases(records: list[dict], path: str) -> None:
    plt, fig, axes = _figure(len(records), height=5.4)
    for ax, r in zip(axes, records):
        sides = [("ref", r["reference"])] + [(f"P={p}", r["megacache"][str(p)]) for p in _ranks(r)]
        names = [k for k in dict.fromkeys(k for _, side in sides for k in side["median"]["phases"]) if k != OTHER]
        palette = plt.get_cmap("tab10").colors + plt.get_cmap("Set3").colors
        colors = {OTHER: "lightgrey", **dict(zip(names, palette))}
        shown = set()
        for x, (_label, side) in enumerate(sides):
            bottom = 0.0
            for name, seconds in side["median"]["phases"].items():
                ax.bar(x, seconds, bottom=bottom, color=colors[name], label=None if name in shown else name)
                shown.add(name)
                bottom += seconds
        ax.set_xticks(range(len(sides)), [label for label, _ in sides])
        ax.set_title(_title(r), fontsize=10)
        ax.legend(fontsize=7, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3, frameon=False)
    axes[0].set_ylabel("seconds (medians; ref = megatron-core side)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot_vs_megatron(records: list[dict], path: str) -> None:
    plt, fig, axes = _figure(len(records))
    for ax, r in zip(axes, records):
        ref = r["reference"]["median"]["wall_s"]
        labels = ["megatron-core"] + [f"megacache\nP={p}" for p in _ranks(r)]
        walls = [ref] + [r["megacache"][str(p)]["median"]["wall_s"] for p in _ranks(r)]
        bars = ax.bar(range(len(walls)), walls, color=["tab:grey"] + ["tab:blue"] * (len(walls) - 1))
        for b, w in zip(bars[1:], walls[1:]):
            ax.annotate(f"{ref / w:.1f}x", (b.get_x() + b.get_width() / 2, w), ha="center", va="bottom", fontsize=8)
        ax.set_xticks(range(len(walls)), labels, fontsize=8)
        ax.set_title(_title(r), fontsize=10)
    axes[0].set_ylabel("wall seconds (medians, from outside)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------------------
# Table


def _describe(r: dict) -> str:
    p, out = r["params"], r["outputs"]
    if r["workload"] == "tokenize":
        what = (f"{p['corpus_bytes'] / 1e6:,.1f} MB of generated text, {p['documents']:,} documents, "
                f"{_tokens(r):,} tokens, {p['vocab_size']:,}-token BPE, units of {p['unit_bytes']:,} bytes")
    elif r["workload"] == "blend_kernel":
        what = f"{p['samples']:,} samples x {p['datasets']:,} datasets, {p['weights']} weights"
    else:
        what = (f"{p['datasets']:,} dataset(s), {p['documents']:,} documents, {p['tokens']:,} tokens, "
                f"L = {p['seq_length']}, split \"{p['split']}\", sizes {p['sizes']}")
    return (f"**{r['workload']}** ({r['suite']} suite, factor {r['factor']:g}, {r['repeats']} repeat(s), "
            f"{r['time']}): {what}; outputs {out['files']:,} files, {out['bytes'] / 2**20:,.1f} MiB. "
            f"Reference: {r['reference_name']}, one process.")


def _tokens(r: dict) -> int:
    return r["outputs"]["bytes_by_suffix"][".bin"] // 2  # uint16 tokens below a 65500 vocabulary


def _headline(r: dict) -> str:
    """The figure of merit the issue set for this workload, from the same record."""
    ref, sides = r["reference"]["median"], {int(p): s["median"] for p, s in r["megacache"].items()}
    if r["workload"] == "tokenize":
        hf = _tokens(r) / ref["phases"]["encode"]
        bar = _tokens(r) / ref["phases"]["encode_gigatoken_list"]
        fast = _tokens(r) / ref["phases"]["encode_gigatoken"]
        parts = [f"P={p}: {_tokens(r) / s['wall_s']:,.0f} tokens/s ({_tokens(r) / s['wall_s'] / bar:.2f}x gigatoken's "
                 f"lists, {_tokens(r) / s['wall_s'] / fast:.2f}x its arrays, {_tokens(r) / s['wall_s'] / hf:.1f}x Hugging Face)"
                 for p, s in sides.items()]
        return (f"Throughput: megacache's tokens/s from outside, start-up and I/O included, against raw encode "
                f"calls on the same texts, batches and threads: Hugging Face tokenizers {hf:,.0f} tokens/s; "
                f"gigatoken {bar:,.0f} tokens/s giving Python lists ({bar / hf:.1f}x Hugging Face; bar 0.90x of "
                f"it at P=2) and {fast:,.0f} tokens/s giving arrays: " + "; ".join(parts))
    if r["workload"] == "blend_kernel":
        theirs = sum(ref["phases"][k] for k in ("blend", "write", "sync"))
        ours = ("create", "blend", "wait", "repair", "sync")
        parts = [f"P={p}: {theirs / sum(s['phases'][k] for k in ours):.1f}x" for p, s in sides.items()]
        return (f"Seconds in the process from the weights to the arrays durable on disk: megatron-core's kernel, "
                f"numpy.save and a sync, {theirs:.2f} s, against megacache's blend as a build runs it (its files "
                f"made, each rank's chunk blended into them, the chunks confirmed, a sync): " + "; ".join(parts))
    bar = {"build_gpt": 3, "build_blend": 10}[r["workload"]]
    parts = [f"P={p}: {s['vs_reference']['speedup_wall']:.1f}x faster, {s['vs_reference']['rss_ratio']:.2f}x RSS"
             for p, s in sides.items()]
    return f"Against megatron-core, wall time from outside (bars at P=2: {bar}x, 0.5x RSS): " + "; ".join(parts)


def _mib(value) -> str:
    return "n/a" if value is None else f"{value / 2**20:,.1f}"


def table(records: list[dict], results: str) -> str:
    first = records[0]
    m = first["machine"]
    v = m["versions"]
    commit = (m["git_commit"] or "unknown")[:10]
    lines = [
        f"<!-- written by `python -m benchmarks report` from {shown(results)}: every number below comes "
        "from that file -->",
        "",
        f"Machine: {m['cpu']}, {m['cpus_usable']} usable CPU(s), {m['ram_gib']:.0f} GiB RAM; Python {v['python']}, "
        f"numpy {v['numpy']}, numba {v['numba']}, megacache {v['megacache']} (commit {commit}), megatron-core "
        f"{v['megatron_core']}, MPI launcher {v['mpiexec']}. megacache runs under `mpiexec -n P` (more ranks than "
        "cores oversubscribe them); the reference is one process. Wall seconds are from outside (start-up and "
        "imports included); work = the program's own timed phases; CPU = user + system summed over ranks; RSS = "
        "the largest rank's peak; written = bytes that reached the block layer. Medians over repeats. Speed-up and "
        "efficiency are against the smallest P, from wall time and from the busiest rank's CPU time (what P "
        "dedicated cores would give); CPU efficiency = total CPU at the smallest P / total CPU at P. Every "
        "megacache output was byte-identical to the reference's.",
        "",
        "| workload | side | P | wall s | work s | CPU s | peak RSS GiB | written MiB | speed-up wall / CPU "
        "| efficiency wall / CPU | vs megatron-core (wall) |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in records:
        ref = r["reference"]["median"]
        lines.append(f"| {r['workload']} | megatron-core | 1 | {ref['wall_s']:.2f} | {ref['work_s']:.2f} | "
                     f"{ref['cpu_s']:.2f} | {ref['rss_max_kb'] / 2**20:.2f} | {_mib(ref['write_bytes'])} | | | 1.00x |")
        for p in _ranks(r):
            s = r["megacache"][str(p)]["median"]
            sc = s["scaling"]
            lines.append(
                f"| {r['workload']} | megacache | {p} | {s['wall_s']:.2f} | {s['work_s']:.2f} | {s['cpu_s']:.2f} | "
                f"{s['rss_max_kb'] / 2**20:.2f} | {_mib(s['write_bytes'])} | {sc['speedup_wall']:.2f}x / "
                f"{sc['speedup_cpu']:.2f}x | {sc['efficiency_wall']:.2f} / {sc['efficiency_cpu']:.2f} | "
                f"{s['vs_reference']['speedup_wall']:.2f}x |")
    lines.append("")
    for r in records:
        lines += [f"- {_describe(r)}", f"  {_headline(r)}."]
    lines += ["", "Phases (median seconds; `other` = start-up, imports not timed by the program, and exit):", ""]
    for r in records:
        for label, side in [("megatron-core", r["reference"])] + [(f"megacache P={p}", r["megacache"][str(p)])
                                                                  for p in _ranks(r)]:
            phases = ", ".join(f"{k} {v:.2f}" for k, v in side["median"]["phases"].items())
            lines.append(f"- {r['workload']}, {label}: {phases}")
    return "\n".join(lines) + "\n"


README_START = "<!-- benchmarks table: start -->"
README_END = "<!-- benchmarks table: end -->"


def readme_table(records: list[dict], results: str) -> str:
    """The README's summary: per workload, each side's median wall time and megacache's ratio to
    megatron-core; from the results alone. Dates, sizes and bars stay in ``TABLE.md`` (``table``):
    the README is a user's guide, not a record of runs."""
    ranks = sorted({p for r in records for p in _ranks(r)})
    lines = [
        README_START,
        f"<!-- written by `python -m benchmarks report --readme README.md` from {shown(results)}; "
        "edits here are overwritten -->",
        "",
        "| workload | megatron-core | " + " | ".join(f"megacache P = {p}" for p in ranks) + " |",
        "|---|---:|" + "---:|" * len(ranks),
    ]
    for r in records:
        ref = r["reference"]["median"]
        cells = []
        for p in ranks:
            side = r["megacache"].get(str(p))
            if side is None:
                cells.append("")
                continue
            s = side["median"]
            cells.append(f"{s['wall_s']:.1f} s ({s['vs_reference']['speedup_wall']:.1f}x), "
                         f"{s['rss_max_kb'] / 2**20:.2f} GiB")
        lines.append(f"| `{r['workload']}` ({r['suite']}, factor {r['factor']:g}, {r['repeats']} repeat(s)) | "
                     f"{ref['wall_s']:.1f} s, {ref['rss_max_kb'] / 2**20:.2f} GiB | " + " | ".join(cells) + " |")
    details = os.path.join(os.path.dirname(shown(results)), "TABLE.md")
    lines += ["", "Wall time from outside (median), its ratio to megatron-core's, and the largest rank's peak RSS; "
                  f"each workload's size, reference, bar, date and phases are in `{details}`.", README_END]
    return "\n".join(lines)


def _replace_block(path: str, start_marker: str, end_marker: str, block: str) -> None:
    """Replace the block of the Markdown file ``path`` from ``start_marker`` to ``end_marker`` (both
    included)."""
    with open(path) as f:
        text = f.read()
    start, end = text.find(start_marker), text.find(end_marker)
    if start < 0 or end < start:
        raise SystemExit(f"{path}: no '{start_marker}' ... '{end_marker}' block to replace")
    with open(path, "w") as f:
        f.write(text[:start] + block + text[end + len(end_marker):])


def write_readme_table(records: list[dict], results: str, readme: str) -> None:
    """Replace the marked block of ``readme`` with ``readme_table``."""
    _replace_block(readme, README_START, README_END, readme_table(records, results))


def write_report(results: str, suite: str | None = None, readme: str | None = None) -> list[str]:
    """Every file of the report, next to ``results``; returns their paths."""
    records = _selected(results, suite)
    out = os.path.dirname(os.path.abspath(results))
    paths = [os.path.join(out, n) for n in ("speedup.png", "phases.png", "vs_megatron.png", "TABLE.md")]
    plot_speedup(records, paths[0])
    plot_phases(records, paths[1])
    plot_vs_megatron(records, paths[2])
    with open(paths[3], "w") as f:
        f.write(table(records, results))
    if readme is not None:
        write_readme_table(records, results, readme)
        paths.append(readme)
    return [shown(p) for p in paths]


# ------------------------------------------------------------------------------------------------
# Scale: one workload at several sizes

SCALE_START = "<!-- scale table: start -->"
SCALE_END = "<!-- scale table: end -->"


def scale_records(results: str, workload: str = "build_blend") -> list[dict]:
    """The latest record of ``workload`` at each factor, smallest factor first."""
    per_factor: dict[float, dict] = {}
    for r in load_records(results):
        if r["workload"] == workload:
            per_factor[r["factor"]] = r
    if len(per_factor) < 2:
        raise SystemExit(f"{results}: {workload} measured at {len(per_factor)} size(s); growth needs two or more "
                         "(`python -m benchmarks run --suite scale`)")
    return [per_factor[f] for f in sorted(per_factor)]


def growth(sizes: list[float], values: list[float]) -> tuple[float, float]:
    """(last / first, b): the ratio between the largest and the smallest size, and the exponent
    of the least-squares fit ``value = a * size**b`` in log-log."""
    import numpy as np

    x, y = np.log(sizes), np.log(values)
    spread = float(((x - x.mean()) ** 2).sum())
    b = float(((x - x.mean()) * (y - y.mean())).sum()) / spread if spread else float("nan")
    return values[-1] / values[0], b


def _sides(r: dict) -> list[tuple[str, dict]]:
    return [("megatron-core", r["reference"]["median"])] + [(f"megacache P={p}", r["megacache"][str(p)]["median"])
                                                            for p in _ranks(r)]


def scale_table(records: list[dict], results: str) -> str:
    """Time, phases and peak RSS per rank against the size, the fitted growth, and the issue's bars."""
    first, last = records[0], records[-1]
    times = sorted(r["time"] for r in records)  # a size may have been measured again later
    ranks = _ranks(last)
    sizes = [r["params"]["tokens"] for r in records]
    lines = [
        SCALE_START,
        f"<!-- written by `python -m benchmarks scale-report` from {shown(results)}; edits here are overwritten -->",
        "",
        f"`{first['workload']}` at {len(records)} sizes (measured {times[0]} to {times[-1]}, "
        f"{first['machine']['cpus_usable']} cores, {first['machine']['ram_gib']:.0f} GiB): wall time from outside "
        "(medians of the repeats), the largest rank's peak RSS, megacache against megatron-core in the same run; "
        "outputs byte-identical at every size.",
        "",
        "| factor | datasets | documents | tokens | blend samples | megatron-core | "
        + " | ".join(f"megacache P = {p}" for p in ranks) + " |",
        "|---:|---:|---:|---:|---:|---:|" + "---:|" * len(ranks),
    ]
    for r in records:
        p, ref = r["params"], r["reference"]["median"]
        blend = r["outputs"]["arrays"].get("dataset_index", {}).get("elements", 0)
        cells = []
        for q in ranks:
            s = r["megacache"][str(q)]["median"]
            cells.append(f"{s['wall_s']:.1f} s ({s['vs_reference']['speedup_wall']:.1f}x), "
                         f"{s['rss_max_kb'] / 2**20:.2f} GiB")
        lines.append(f"| {r['factor']:g} | {p['datasets']:,} | {p['documents']:.3g} | {p['tokens']:.3g} | {blend:.3g} | "
                     f"{ref['wall_s']:.1f} s, {ref['rss_max_kb'] / 2**20:.2f} GiB | " + " | ".join(cells) + " |")
    lines += ["", f"Growth from factor {first['factor']:g} to {last['factor']:g} ({sizes[-1] / sizes[0]:.1f}x the "
                  "tokens): ratio of the largest to the smallest, and b of the fit value = a · tokens^b.", "",
              "| side | time ratio | time b | RSS ratio | RSS b |", "|---|---:|---:|---:|---:|"]
    for k, (label, _) in enumerate(_sides(last)):
        walls = [_sides(r)[k][1]["wall_s"] for r in records]
        rss = [_sides(r)[k][1]["rss_max_kb"] for r in records]
        (tr, tb), (rr, rb) = growth(sizes, walls), growth(sizes, rss)
        lines.append(f"| {label} | {tr:.2f}x | {tb:.2f} | {rr:.2f}x | {rb:.2f} |")
    lines += ["", "Phases (median seconds) at each size:", ""]
    for r in records:
        for label, side in _sides(r):
            phases = ", ".join(f"{k} {v:.2f}" for k, v in side["phases"].items())
            lines.append(f"- factor {r['factor']:g}, {label}: {phases}")
    lines.append(SCALE_END)
    return "\n".join(lines)


def write_scale_report(results: str, doc: str | None = None) -> list[str]:
    """``SCALE.md`` next to ``results`` (and the scale block of ``doc``, a Markdown file such as
    docs/benchmarks.md); returns the paths."""
    records = scale_records(results)
    text = scale_table(records, results)
    path = os.path.join(os.path.dirname(os.path.abspath(results)), "SCALE.md")
    with open(path, "w") as f:
        f.write("# Scale\n\n" + text + "\n")
    paths = [path]
    if doc is not None:
        _replace_block(doc, SCALE_START, SCALE_END, text)
        paths.append(doc)
    return [shown(p) for p in paths]


# ------------------------------------------------------------------------------------------------
# Start: training's start with and without megacache's cache (start.py)

START_START = "<!-- start table: start -->"
START_END = "<!-- start table: end -->"


def start_records(results: str) -> list[dict]:
    """The latest start record of each factor, smallest factor first."""
    from .start import load_records as load_start

    per_factor: dict[float, dict] = {}
    for r in load_start(results):
        per_factor[r["factor"]] = r
    if not per_factor:
        raise SystemExit(f"{results}: no start records; run `python -m benchmarks run --suite start` first")
    return [per_factor[f] for f in sorted(per_factor)]


def _gib(kb: float) -> str:
    return f"{kb / 2**20:.2f} GiB"


def _start_label(name: str, config: dict) -> str:
    """A configuration's name in the tables (the record's own where this version no longer has it)."""
    from .start import CONFIGS

    return CONFIGS[name].label if name in CONFIGS else config["label"]


def _start_cell(r: dict) -> str:
    return (f"{r['data_s']:.2f} s ({r['whole_s']:.1f} s), {r['files_data']:,.0f} files "
            f"({r['opens_data']:,.0f} opens), {_gib(r['rss_kb'])}")


def start_ratios(record: dict) -> dict:
    """(a) against the others on each rank, from the medians: data start and whole process."""
    configs = record["configs"]
    if "a" not in configs:
        return {}
    a = configs["a"]["median"]["ranks"]
    return {name: [{"data": a[k]["data_s"] / r["data_s"], "whole": a[k]["whole_s"] / r["whole_s"]}
                   for k, r in enumerate(c["median"]["ranks"])]
            for name, c in configs.items() if name != "a"}


def _start_sizes(r: dict) -> str:
    p = r["params"]
    return (f"{p['datasets']:,} datasets, {p['documents']:,} documents, {p['tokens']:,} tokens, "
            f"L = {p['seq_length']}, samples per split {p['sizes']}")


def _ratio_sentence(r: dict) -> str:
    ratios = start_ratios(r)
    if "c" not in ratios:
        return ""
    c, b = ratios["c"][1], ratios.get("b", [None, None])[1]
    text = (f"(a) / (c) on the waiting rank (rank 1): **{c['data']:.0f}x** from the data flags to sample 0, "
            f"{c['whole']:.1f}x from the processes' start (imports included)")
    if b:
        text += f"; (a) / (b): {b['data']:.1f}x and {b['whole']:.1f}x"
    return text + "."


def start_readme_table(records: list[dict], results: str) -> str:
    """The README's start table: per factor, per configuration and rank, from the results alone."""
    lines = [
        START_START,
        f"<!-- written by `python -m benchmarks start-report --readme README.md` from {shown(results)}; "
        "edits here are overwritten -->",
        "",
        "**What the cache saves at the start of training.** megatron-core 0.19.2's `BlendedMegatronDatasetBuilder` "
        "on 2 gloo ranks, as training calls it, for a blend of 1000 datasets, on this 2-core machine: per rank, the "
        "seconds from reading the data flags to having read sample 0 of the train split (in brackets: from the "
        "rank's process start, the imports of torch and megatron-core included), the files it opened meanwhile "
        "(to read or to write), and its peak RSS; medians. (a) no cache: rank 0 builds, rank 1 waits; (b) "
        "megacache's cache, training's default flags; (c) megacache's cache with `--dataloader-fast-cache-load`, "
        "`--dataloader-defer-npy-index-mmap`, the data per split and megacache's `--per-dataset-sequences-path` "
        "file; and megacache's own `prepare_cache` on the flags of (b).",
    ]
    for r in records:
        lines += ["", f"Factor {r['factor']:g} ({_start_sizes(r)}), medians of {r['repeats']}, measured "
                      f"{r['time'][:16].replace('T', ' ')}:", "",
                  "| configuration | rank 0 | rank 1 (waits in (a)) |", "|---|---:|---:|"]
        for name in r["order"]:
            c = r["configs"][name]
            lines.append(f"| {_start_label(name, c)} | " + " | ".join(_start_cell(x) for x in c["median"]["ranks"])
                         + " |")
        sentence = _ratio_sentence(r)
        if sentence:
            lines += ["", sentence]
    details = os.path.join(os.path.dirname(shown(results)), "START.md")
    lines += ["", f"Every run, phase and check: `{details}`; how it was measured: "
                  "[docs/benchmarks.md](docs/benchmarks.md#the-start-of-training).", START_END]
    return "\n".join(lines)


def start_table(records: list[dict], results: str) -> str:
    """START.md: each factor's medians per configuration and rank, its ratios, phases, every run, the
    megacache builds before them, and the checks."""
    lines = ["# The start of training", "",
             f"<!-- written by `python -m benchmarks start-report` from {shown(results)}: every number below comes "
             "from that file -->"]
    for r in records:
        m, v, mv = r["machine"], r["machine"]["versions"], r["megatron"]["versions"]
        lines += [
            "", f"## Factor {r['factor']:g}", "",
            f"Measured {r['time']} ({r['suite']} suite, run {r['run_id']}, {r['repeats']} repeat(s), the "
            f"configurations alternating within each): {_start_sizes(r)}; (c)'s per-split data: "
            f"{r['params']['per_split']}. Machine: {m['cpu']}, {m['cpus_usable']} usable CPU(s), "
            f"{m['ram_gib']:.0f} GiB RAM; megatron-core {mv.get('megatron_core')} (Python {mv['python']}, torch "
            f"{mv['torch']}, numpy {mv['numpy']}); megacache {v['megacache']} (commit "
            f"{(m['git_commit'] or 'unknown')[:10]}, Python {v['python']}).",
            "",
            "Per rank, medians: data = from reading the data flags to having read sample 0 of the train split; "
            "whole = from the process's start; builder = the `BlendedMegatronDatasetBuilder(...).build()` call "
            "(megacache: `prepare_cache`); imports = process start to torch and the library imported; files and "
            "opens within data (Python-level opens: an audit hook; C-level opens such as shared libraries are not "
            "counted); process opens = the same from the process's start (imports included); RSS = peak at sample 0.",
            "",
            "| configuration | rank | data s | whole s | builder s | imports s | files (opens) in data | mmaps in data "
            "| process opens | peak RSS |",
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
        ]
        for name in r["order"]:
            c = r["configs"][name]
            for k, x in enumerate(c["median"]["ranks"]):
                lines.append(f"| {_start_label(name, c)} | {k} | {x['data_s']:.2f} | {x['whole_s']:.2f} | "
                             f"{x['build_s']:.2f} | "
                             f"{x['marks']['import']:.2f} | {x['files_data']:,.0f} ({x['opens_data']:,.0f}) | "
                             f"{x['mmaps_data']:,.0f} | {x['opens_process']:,.0f} | {_gib(x['rss_kb'])} |")
        lines += [""]
        for name in r["order"]:
            lines.append(f"- {_start_label(name, r['configs'][name])}: {r['configs'][name]['text']}.")
        ratios = start_ratios(r)
        if ratios:
            lines += ["", "(a) against each, per rank (data / whole): " + "; ".join(
                f"{_start_label(n, r['configs'][n])}: " + ", ".join(f"rank {k} {x['data']:.1f}x / {x['whole']:.1f}x"
                                                          for k, x in enumerate(rs))
                for n, rs in ratios.items()) + "."]
        lines += ["", "Each run (launch to both ranks' exit; per rank: data s / whole s):", ""]
        for name in r["order"]:
            c = r["configs"][name]
            runs = "; ".join(f"{run['wall_s']:.2f} s (" + ", ".join(f"{x['data_s']:.2f} / {x['whole_s']:.2f}"
                                                                    for x in run["ranks"]) + ")"
                             for run in c["runs"])
            lines.append(f"- {_start_label(name, c)}: {runs}")
        lines += ["", "Marks, median seconds from each rank's process start:", ""]
        for name in r["order"]:
            c = r["configs"][name]
            for k, x in enumerate(c["median"]["ranks"]):
                marks = ", ".join(f"{n} {s:.2f}" for n, s in x["marks"].items())
                lines.append(f"- {_start_label(name, c)}, rank {k}: {marks}, sample 0 {x['whole_s']:.2f}")
        builds = "; ".join(f"{layout}: {b['wall_s']:.1f} s, {b['bytes'] / 2**20:,.1f} MiB"
                           for layout, b in r["builds"].items())
        sample = r["expected_sample"]
        lines += ["", f"megacache built both caches before the runs, once (`mpiexec -n 2 megacache build "
                      f"--megatron-version 0.19`, wall time and size): {builds}.",
                  "", f"Checks: every rank of every run read sample 0 as megacache's `open_cache` reads it from "
                      f"its cache (split data: dataset {sample['split']['dataset']}, its sample "
                      f"{sample['split']['sample']}; per-split data: dataset {sample['per_split']['dataset']}, its "
                      f"sample {sample['per_split']['sample']}); runs with a cache left it unchanged; megatron-core's "
                      f"own cache in (a) was byte-identical to megacache's ({r['compared']['outputs']} build(s), "
                      f"{r['compared']['bytes'] / 2**20:,.1f} MiB compared)."]
    return "\n".join(lines) + "\n"


def write_start_report(results: str, readme: str | None = None) -> list[str]:
    """``START.md`` next to ``results`` (and the start block of ``readme``); returns the paths."""
    records = start_records(results)
    path = os.path.join(os.path.dirname(os.path.abspath(results)), "START.md")
    with open(path, "w") as f:
        f.write(start_table(records, results))
    paths = [path]
    if readme is not None:
        _replace_block(readme, START_START, START_END, start_readme_table(records, results))
        paths.append(readme)
    return [shown(p) for p in paths]
