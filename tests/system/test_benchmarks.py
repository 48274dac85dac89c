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
        assert r["identical"] is True, r["workload"]
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
    SCALE.md with a row per size and the fitted growth, and the README's scale block rewritten."""
    results = str(tmp_path / "scale.jsonl")
    env = dict(os.environ, PYTHONWARNINGS="ignore")
    run = subprocess.run([sys.executable, "-m", "benchmarks", "run", "--suite", "smoke", "--only", "build_blend",
                          "--ranks", "2", "--factor", "0.0002", "0.001", "--results", results],
                         cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    records = [json.loads(line) for line in open(results)]
    assert [(r["workload"], r["factor"]) for r in records] == [("build_blend", 0.0002), ("build_blend", 0.001)]
    assert all(r["identical"] for r in records)
    scale = open(tmp_path / "SCALE.md").read()
    for r in records:
        wall = r["megacache"]["2"]["median"]["wall_s"]
        assert re.search(rf"\| {r['factor']:g} \| 20 \| .* \| {wall:.1f} s \(", scale), scale
    assert re.search(r"\| megacache P=2 \| [0-9.]+x \| -?[0-9.]+ \| [0-9.]+x \| -?[0-9.]+ \|", scale), scale
    readme = tmp_path / "README.md"
    readme.write_text("a\n<!-- scale table: start -->\nold\n<!-- scale table: end -->\nb\n")
    rep = subprocess.run([sys.executable, "-m", "benchmarks", "scale-report", "--results", results, "--readme",
                          str(readme)], cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert rep.returncode == 0, rep.stderr
    text = readme.read_text()
    assert text.startswith("a\n<!-- scale table: start -->") and text.endswith("<!-- scale table: end -->\nb\n")
    assert "old" not in text and "Growth from factor 0.0002 to 0.001" in text
