"""The benchmark suite runs end to end: ``python -m benchmarks run --suite smoke`` (every workload at a
tiny size, P = 1 and 2 under real mpiexec, megatron-core beside megacache, outputs compared byte for
byte) writes its JSON lines, plots and table, and the projection is computed from them."""

from __future__ import annotations

import json
import re
import os
import subprocess
import sys

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def test_smoke_suite_writes_results_plots_table_and_projection(tmp_path):
    results = str(tmp_path / "smoke.jsonl")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    run = subprocess.run([sys.executable, "-m", "benchmarks", "run", "--suite", "smoke", "--results", results],
                         cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = [json.loads(line) for line in open(results)]
    assert sorted(r["workload"] for r in records) == ["blend_kernel", "build_blend", "build_gpt", "tokenize"]
    for r in records:
        # every megacache run's files compared with the reference's, byte for byte, and not empty
        assert r["compared"] == {"outputs": 2, "bytes": 2 * r["outputs"]["bytes"]} and r["outputs"]["bytes"] > 0, r
        assert r["ranks"] == [1, 2] and r["machine"]["cpus"] >= 1
    for name in ("speedup.png", "phases.png", "vs_megatron.png", "TABLE.md"):
        assert os.path.getsize(tmp_path / name) > 0, name
    table = open(tmp_path / "TABLE.md").read()
    assert "| build_blend | megacache | 2 |" in table
    readme = tmp_path / "README.md"
    readme.write_text("intro\n<!-- benchmarks table: start -->\nold\n<!-- benchmarks table: end -->\noutro\n")
    rep = subprocess.run([sys.executable, "-m", "benchmarks", "report", "--results", results, "--readme", str(readme)],
                         cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert rep.returncode == 0, rep.stderr
    text = readme.read_text()
    assert text.startswith("intro\n") and text.endswith("outro\n") and "old" not in text
    kernel = next(r for r in records if r["workload"] == "blend_kernel")
    wall = kernel["megacache"]["2"]["median"]["wall_s"]
    assert f"| `blend_kernel` (smoke, factor 0.0002, 1 repeat(s)) |" in text and f"{wall:.1f} s (" in text
    projection = str(tmp_path / "projection.md")
    proj = subprocess.run([sys.executable, "-m", "benchmarks", "project", "--results", results, "--scale-results", "",
                           "--output", projection],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert proj.returncode == 0, proj.stderr
    text = open(projection).read()
    # the table of phases has a column per rank count, and a total for each
    assert "| phase | P = 64 | P = 512 | P = 4096 |" in text, text
    assert re.search(r"Against it: P = 64: \d+x; P = 512: \d+x; P = 4096: \d+x\.", text), text


def test_sizes_measured_in_one_run_give_the_scale_report(tmp_path):
    """Several factors in one run (what the scale suite does at 1, 3 and 10): a record per factor,
    SCALE.md with a row per size and the fitted growth, and the scale block of docs/benchmarks.md
    (here a stand-in) rewritten."""
    results = str(tmp_path / "scale.jsonl")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    run = subprocess.run([sys.executable, "-m", "benchmarks", "run", "--suite", "smoke", "--only", "build_blend",
                          "--ranks", "2", "--factor", "0.0002", "0.001", "--results", results],
                         cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = [json.loads(line) for line in open(results)]
    assert [(r["workload"], r["factor"]) for r in records] == [("build_blend", 0.0002), ("build_blend", 0.001)]
    assert all(r["compared"] == {"outputs": 1, "bytes": r["outputs"]["bytes"]} and r["outputs"]["bytes"] > 0
               for r in records), records
    scale = open(tmp_path / "SCALE.md").read()
    for r in records:
        wall = r["megacache"]["2"]["median"]["wall_s"]
        assert re.search(rf"\| {r['factor']:g} \| 20 \| .* \| {wall:.1f} s \(", scale), scale
    assert re.search(r"\| megacache P=2 \| [0-9.]+x \| -?[0-9.]+ \| [0-9.]+x \| -?[0-9.]+ \|", scale), scale
    doc = tmp_path / "benchmarks.md"
    doc.write_text("a\n<!-- scale table: start -->\nold\n<!-- scale table: end -->\nb\n")
    rep = subprocess.run([sys.executable, "-m", "benchmarks", "scale-report", "--results", results, "--doc",
                          str(doc)], cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert rep.returncode == 0, rep.stderr
    text = doc.read_text()
    assert text.startswith("a\n<!-- scale table: start -->") and text.endswith("<!-- scale table: end -->\nb\n")
    assert "old" not in text and "Growth from factor 0.0002 to 0.001" in text


def test_floor_times_the_build_beside_its_start_up_and_its_files_alone(tmp_path):
    """``python -m benchmarks floor``: per repeat megatron-core's build, megacache's (the same bytes),
    its ranks' start-up alone and its output files written alone, each timed from outside; one
    record with the four medians."""
    results = str(tmp_path / "floor.jsonl")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    run = subprocess.run([sys.executable, "-m", "benchmarks", "floor", "--suite", "smoke", "--factor", "0.0002",
                          "--repeats", "1", "--results", results],
                         cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (record,) = [json.loads(line) for line in open(results)]
    assert record["benchmark"] == "floor" and record["ranks"] == 2 and record["params"]["datasets"] == 20
    for side in ("reference", "build", "start", "files"):
        assert len(record[side]["runs"]) == 1 and record[side]["median"]["wall_s"] > 0, side
    assert set(record["start"]["median"]["phases"]) == {"first_kernel", "other"}
    assert set(record["files"]["median"]["phases"]) == {"write", "sync", "publish", "other"}
    # 20 datasets x 3 splits x 4 files, and 3 blends x 3 files
    assert record["outputs"]["files"] == 249
    assert "the two together:" in run.stdout and "(249 files," in run.stdout
    assert "10x megatron-core:" in run.stdout


def test_floor_files_writes_the_same_names_and_sizes_split_over_the_ranks(tmp_path):
    source, dest = tmp_path / "source", tmp_path / "dest"
    source.mkdir()
    dest.mkdir()
    (source / ".megacache").mkdir()  # megacache's state directory: not an output
    sizes = {f"entry-{i}.npy": 1000 * i + 7 for i in range(5)}
    for name, size in sizes.items():
        (source / name).write_bytes(os.urandom(size))
    run = subprocess.run(["mpiexec", "-n", "2", sys.executable, "-m", "benchmarks.floor", "files", str(source),
                          str(dest)], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stdout + run.stderr
    assert {p.name: p.stat().st_size for p in dest.iterdir()} == sizes
    assert re.fullmatch(r"  phases: write [0-9.]+ s, sync [0-9.]+ s, publish [0-9.]+ s\n", run.stdout), run.stdout
