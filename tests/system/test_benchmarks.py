"""The benchmark suite runs end to end: ``python -m benchmarks run --suite smoke`` (every workload at a
tiny size, P = 1 and 2 under real mpiexec, megatron-core beside megacache, outputs compared byte for
byte) writes its JSON lines, plots and table, and the projection is computed from them; the start
suite (``--suite start-smoke``) measures training's start on 2 gloo ranks and writes its table;
``benchmarks ab`` times two commits of megacache alternately from copies of their own; a failed
measurement keeps its work directory and says where; ``benchmarks prepare`` says how to mend a
helpers build without pybind11;
``benchmarks.sft_pack`` times megacache pack and Megatron-Bridge alternately, their bytes compared;
``benchmarks.object_storage`` times tokenize and build from moto's S3 server beside local disk, with
the requests and bytes its proxy counts."""

from __future__ import annotations

import json
import re
import os
import shutil
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def bench_env(**extra: str) -> dict:
    """The benchmarks' environment: these tests check what they measure and record, not the times, so no
    benchmark waits for a quiet filesystem (``harness.quiet_filesystem`` probes once and goes on)."""
    return dict(os.environ, PYTHONWARNINGS="ignore", MEGACACHE_BENCH_QUIET_WAIT_S="0", **extra)


def benchmark(tmp_path, module: str, *args: str) -> tuple[str, list[dict]]:
    """``python -m MODULE ARGS --results FILE`` run in the repository: what it printed, and its records."""
    results = tmp_path / f"{module}.jsonl"
    run = subprocess.run([sys.executable, "-m", module, *args, "--results", str(results)], cwd=REPO,
                         capture_output=True, text=True, env=bench_env(), timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return run.stdout, [json.loads(line) for line in results.read_text().splitlines()]


def test_smoke_suite_writes_results_plots_table_and_projection(tmp_path):
    results = str(tmp_path / "smoke.jsonl")
    env = bench_env()
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
    assert "| `blend_kernel` (smoke, factor 0.0002, 1 repeat(s)) |" in text and f"{wall:.1f} s (" in text
    projection = str(tmp_path / "projection.md")
    proj = subprocess.run([sys.executable, "-m", "benchmarks", "project", "--results", results, "--scale-results", "",
                           "--seed-results", "", "--output", projection],
                          cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert proj.returncode == 0, proj.stderr
    text = open(projection).read()
    # the table of phases has a column per rank count, and a total for each
    assert "| phase | P = 64 | P = 512 | P = 4096 |" in text, text
    assert re.search(r"Against it: P = 64: \d+x; P = 512: \d+x; P = 4096: \d+x\.", text), text


def test_sizes_measured_in_one_run_give_the_scale_report(tmp_path):
    """Several factors in one run (what the scale suite does at 1, 3 and 10): a record per factor,
    SCALE.md with a row per size and the fitted growth, and the scale block of docs/benchmarks.md
    (a stand-in in this test) rewritten."""
    results = str(tmp_path / "scale.jsonl")
    env = bench_env()
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
    # the scale suite run again at one of its sizes: SCALE.md from the file's latest record of each
    # size, and neither TABLE.md nor the plots, which are the other suites' (from suite.jsonl)
    again = subprocess.run([sys.executable, "-m", "benchmarks", "run", "--suite", "scale", "--factor", "0.0002",
                            "--results", results], cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    latest = json.loads(open(results).readlines()[-1])
    assert (latest["suite"], latest["factor"]) == ("scale", 0.0002)
    wall = latest["megacache"]["2"]["median"]["wall_s"]
    scale = open(tmp_path / "SCALE.md").read()
    assert re.search(rf"\| 0.0002 \| {latest['params']['datasets']:,} \| .* \| {wall:.1f} s \(", scale), scale
    assert sorted(os.listdir(tmp_path)) == ["SCALE.md", "benchmarks.md", "scale.jsonl"]


def test_floor_times_the_build_beside_its_start_up_and_its_files_alone(tmp_path):
    """``python -m benchmarks floor``: per repeat megatron-core's build, megacache's (the same bytes),
    its ranks' start-up alone and its output files written alone, each timed from outside; one
    record with the four medians."""
    results = str(tmp_path / "floor.jsonl")
    env = bench_env()
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


def test_the_seed_report_tables_the_build_at_each_factor_run():
    """The growth table: a row per factor from its latest record, and the growth from the smallest
    factor to the largest; nothing while one factor has been run."""
    from benchmarks.seed import SEED_RESULTS, growth, load_seed_records

    records = load_seed_records(SEED_RESULTS)
    factors = sorted({r["factor"] for r in records})
    assert len(factors) >= 2, factors
    text = growth(records)
    for factor in factors:
        last = [r for r in records if r["factor"] == factor][-1]
        (row,) = [line for line in text.splitlines() if line.startswith(f"| {factor:g} | ")]
        assert f"| {last['build']['wall_s']:.1f} s, {last['ranks']} |" in row and last["time"] in row, row
    assert f"From factor {factors[0]:g} to {factors[-1]:g} (" in text
    assert growth([r for r in records if r["factor"] == factors[-1]]) == ""


def test_seed_suite_builds_verifies_and_checks_the_seed_case_at_a_tiny_size(tmp_path):
    """``python -m benchmarks run --suite seed-smoke``: the seed's case (documents of 10,000 tokens)
    at 20 datasets, once at P = 2: the disk's own rate, the build, ``megacache verify``, megatron-core's
    entries of three member datasets compared byte for byte, each blend's counts against the largest
    remainder, and the seed's blend alone; one record, SEED.md, its work directory removed."""
    from benchmarks.seed import against_largest_remainder

    # the greedy is not largest remainder: w = (0.1, 0.9), 3 samples: the greedy takes (1, 2), Hamilton (0, 3)
    assert against_largest_remainder([1, 2], [0.1, 0.9], 3)["differences"] == {"0": 1, "1": -1}
    results = str(tmp_path / "seed.jsonl")
    env = bench_env(TMPDIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-m", "benchmarks", "run", "--suite", "seed-smoke", "--results", results],
                         cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (record,) = [json.loads(line) for line in open(results)]
    assert record["benchmark"] == "seed" and record["ranks"] == 2 and record["machine"]["cpus"] >= 1
    assert record["params"]["datasets"] == 20 and record["params"]["mean_length"] == 10000
    build = record["build"]
    assert build["wall_s"] > 0 and len(build["rss_kb"]) == 2 and {"document_index", "publish"} <= set(build["phases"])
    assert record["outputs"]["files"] == 249 and record["verify"]["wall_s"] > 0 and len(record["verify"]["rss_kb"]) == 2
    disk = record["disk"]  # None on tmpfs, which refuses O_DIRECT
    assert disk is None or disk["bytes_per_s"] > 0 and disk["read_bytes_per_s"] > 0, disk
    assert (record["verify_floor_s"] is None) == (disk is None), record["verify_floor_s"]
    members = record["members"]
    assert members["identical"] and members["files"] == 3 * 12 and len(members["indices"]) == 3, members
    assert sorted(record["blends"]) == ["test", "train", "valid"]
    for split, counts in record["blends"].items():
        assert counts["datasets"] == 20 and counts["counted"] == counts["samples"] > 0, (split, counts)
    alone = record["blend_alone"]
    assert alone["samples"] == 1_000_000 and alone["vs_largest_remainder"]["counted"] == 1_000_000
    assert {"blend", "repair", "sync"} <= set(alone["run"]["phases"])
    assert not [n for n in os.listdir(tmp_path) if n.startswith("megacache-bench-seed-")]
    assert "byte-identical to megacache's" in open(tmp_path / "SEED.md").read()
    doc = tmp_path / "benchmarks.md"
    doc.write_text("a\n<!-- seed table: start -->\nold\n<!-- seed table: end -->\nb\n")
    rep = subprocess.run([sys.executable, "-m", "benchmarks.seed", "report", "--results", results, "--doc", str(doc)],
                         cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert rep.returncode == 0, rep.stderr
    text = doc.read_text()
    assert "old" not in text and text.endswith("<!-- seed table: end -->\nb\n")
    assert "| `megacache build`, P = 2 |" in text
    # the projection takes the case and megacache's 1000-dataset constants from the seed record
    projection = tmp_path / "projection.md"
    proj = subprocess.run([sys.executable, "-m", "benchmarks", "project", "--seed-results", results, "--output",
                           str(projection)], cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert proj.returncode == 0, proj.stderr
    text = projection.read_text()
    assert "The case: the seed's" in text and "| phase | P = 64 | P = 512 | P = 4096 |" in text, text


@pytest.mark.oracle_environments
def test_start_suite_measures_each_rank_and_writes_its_table(tmp_path):
    """``python -m benchmarks run --suite start-smoke``: training's start on 2 gloo ranks, megatron-core
    0.19.2 without a cache (a) and with megacache's cache and the fast-load flags (c), and megacache's
    prepare_cache; per configuration and rank the seconds to sample 0, the files opened and the
    peak RSS; megatron-core's own cache byte-identical to megacache's; START.md and the README's block.
    (b) takes the path of (a) with megacache's cache; it is left out to keep this test short."""
    from support.oracles.environments import ROOT as ORACLES, built

    if not built(ORACLES):
        pytest.skip(f"megatron-core 0.19.2 oracle environment not built in {ORACLES}: run bash "
                    "tests/megatron_oracles.sh")
    results = str(tmp_path / "start.jsonl")
    env = bench_env(MEGACACHE_ORACLES=ORACLES)
    run = subprocess.run([sys.executable, "-m", "benchmarks", "run", "--suite", "start-smoke", "--configs", "a", "c",
                          "api", "--results", results], cwd=REPO, capture_output=True, text=True, env=env, timeout=600)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    (record,) = [json.loads(line) for line in open(results)]
    assert record["benchmark"] == "start" and record["params"]["datasets"] == 20
    assert record["order"] == ["a", "c", "api"]
    assert record["megatron"]["versions"]["megatron_core"] == "0.19.2"
    # megatron-core's build in (a) wrote exactly megacache's cache: 20 datasets x 3 splits x 4 files + 3 blends x 3
    assert record["compared"]["outputs"] == 1 and record["compared"]["bytes"] > 0
    for name, config in record["configs"].items():
        (run_,) = config["runs"]
        for rank, r in enumerate(run_["ranks"]):
            assert r["rank"] == rank and r["config"] == name
            assert 0 < r["build_s"] <= r["data_s"] < r["whole_s"] and r["rss_kb"] > 0, r
            assert r["opens"]["data"]["calls"] >= r["opens"]["data"]["files"] > 0, r
            assert r["sample"] == record["expected_sample"][config["layout"]], (name, r["sample"])
    opened = {name: c["runs"][0]["ranks"][0]["opens"]["data"]["by_suffix"] for name, c in record["configs"].items()}
    # (c): every prefix's .idx and .bin mapped once per split, no cache entry opened but sample 0's
    assert opened["c"][".idx"] == opened["c"][".bin"] == 3 * 20 and opened["c"][".npy"] < 20, opened["c"]
    start = (tmp_path / "START.md").read_text()
    assert "| (c) megacache's cache, fast load | 1 |" in start and "byte-identical to megacache's (1 build(s)" in start
    readme = tmp_path / "README.md"
    readme.write_text("intro\n## Benchmarks\n<!-- start table: start -->\nold\n<!-- start table: end -->\nrest\n")
    rep = subprocess.run([sys.executable, "-m", "benchmarks", "start-report", "--results", results, "--readme",
                          str(readme)], cwd=REPO, capture_output=True, text=True, env=env, timeout=120)
    assert rep.returncode == 0, rep.stderr
    text = readme.read_text()
    assert text.startswith("intro\n## Benchmarks\n<!-- start table: start -->") and text.endswith(
        "<!-- start table: end -->\nrest\n") and "old" not in text
    c1 = record["configs"]["c"]["median"]["ranks"][1]
    assert "| (c) megacache's cache, fast load | " in text and f"{c1['data_s']:.2f} s ({c1['whole_s']:.1f} s)" in text
    assert re.search(r"\(a\) / \(c\) on the waiting rank \(rank 1\): \*\*\d+x\*\*", text), text


def test_ab_runs_two_commits_alternating_from_their_own_copies(tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True, check=True).stdout.strip()
    output, [record] = benchmark(tmp_path, "benchmarks", "ab", "HEAD", head, "--suite", "smoke", "--factor", "2e-4",
                                 "--pairs", "2")
    assert (record["a"]["rev"], record["b"]["rev"]) == ("HEAD", head)
    assert record["a"]["commit"] == record["b"]["commit"] == head
    assert record["sequence"] == ["a", "b", "b", "a"] and record["pairs"] == 2 and record["ranks"] == 2
    assert record["compared_bytes"] > 0 and record["machine"]["cpus_usable"] >= 1
    for side in "ab":
        runs = record[side]["runs"]
        assert len(runs) == 2 and all(r["wall_s"] > 0 and len(r["cpu_s"]) == 2 for r in runs), runs
        assert record[side]["median"]["wall_s"] == sorted(r["wall_s"] for r in runs)[0] / 2 + sorted(
            r["wall_s"] for r in runs)[1] / 2
    assert record["b_over_a_wall"] == record["b"]["median"]["wall_s"] / record["a"]["median"]["wall_s"]
    ratios = [b["wall_s"] / a["wall_s"] for a, b in zip(record["a"]["runs"], record["b"]["runs"])]
    assert record["b_over_a_wall_per_pair"] == ratios and record["pairs_b_faster"] == sum(r < 1 for r in ratios)
    assert all(record["untimed"][side]["wall_s"] > 0 for side in "ab")
    assert f"per pair {min(ratios):.3f} to {max(ratios):.3f}, B faster in {record['pairs_b_faster']} of 2" in output, output


def test_ab_refuses_a_revision_that_names_no_commit(tmp_path):
    run = subprocess.run([sys.executable, "-m", "benchmarks", "ab", "HEAD", "no-such-revision-here", "--results",
                          str(tmp_path / "ab.jsonl")], cwd=REPO, capture_output=True, text=True)
    assert run.returncode == 1 and not (tmp_path / "ab.jsonl").exists()
    assert "'no-such-revision-here' names no commit of" in run.stderr, run.stderr


def test_a_failed_measurement_keeps_its_directory_and_says_where(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(REPO)
    from benchmarks.harness import BenchmarkFailure, kept_on_failure

    failed, done, stopped, handed = (tmp_path / name for name in ("failed", "done", "stopped", "handed"))
    for d in (failed, done, stopped, handed):
        (d / "out").mkdir(parents=True)
    with pytest.raises(BenchmarkFailure) as raised:
        with kept_on_failure(str(failed), "inputs and outputs", "build_blend: "):
            raise BenchmarkFailure("the outputs differ")
    assert str(raised.value) == f"build_blend: the outputs differ\n(inputs and outputs kept in {failed})"
    assert (failed / "out").is_dir()
    with kept_on_failure(str(done), "inputs") as work:
        assert work == str(done)
    assert not done.exists()
    with pytest.raises(KeyboardInterrupt):  # not a measurement's failure: nothing to look at
        with kept_on_failure(str(stopped), "inputs"):
            raise KeyboardInterrupt
    assert not stopped.exists()
    later: list[str] = []
    with kept_on_failure(str(handed), "inputs", dispose=later.append):
        pass
    assert later == [str(handed)] and (handed / "out").is_dir()


def test_prepare_says_how_to_mend_a_helpers_build_that_lacks_pybind11(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(REPO)
    from benchmarks.harness import BenchmarkFailure
    from benchmarks.prepare import build_helpers

    if subprocess.run([sys.executable, "-m", "pybind11", "--includes"], capture_output=True).returncode == 0:
        pytest.skip("this interpreter has pybind11")
    # a tree whose helpers' Makefile asks pybind11 for its includes, as Megatron-LM's does
    datasets = tmp_path / "megatron" / "core" / "datasets"
    datasets.mkdir(parents=True)
    (datasets / "Makefile").write_text("default:\n\tpython3 -m pybind11 --includes\n")
    with pytest.raises(BenchmarkFailure) as raised:
        build_helpers(str(tmp_path), sys.executable)
    message = str(raised.value)
    assert f"make -C {datasets} exited 2:" in message and "No module named pybind11" in message, message
    assert message.endswith(f"{sys.executable} has no pybind11, which prepare_cache.py compiles its dataset helpers "
                            f"with: {sys.executable} -m pip install pybind11"), message
    (datasets / "Makefile").write_text("default:\n\ttrue\n")
    build_helpers(str(tmp_path), sys.executable)


def test_a_measurement_whose_kept_outputs_will_not_fit_fails_before_its_next_run(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(REPO)
    from benchmarks.harness import BenchmarkFailure
    from benchmarks.suite import check_space

    half = shutil.disk_usage(tmp_path).free // 2
    check_space(str(tmp_path), {"files": 12009, "bytes": half}, 1)
    with pytest.raises(BenchmarkFailure) as raised:
        check_space(str(tmp_path), {"files": 12009, "bytes": half}, 2)
    message = str(raised.value)
    assert message.startswith(f"the runs still to come need {2 * half / 2**30:.1f} GiB for their outputs "
                              f"({half / 2**30:.1f} GiB each), and {tmp_path}'s filesystem has "), message
    assert message.endswith("free some space, run fewer repeats or ranks, or point TMPDIR at a larger filesystem")


def test_quiet_filesystem_waits_while_creating_a_file_costs_more_than_at_rest(tmp_path, monkeypatch, capsys):
    monkeypatch.syspath_prepend(REPO)
    from benchmarks.harness import QUIET_PROBE_FILES, quiet_filesystem

    monkeypatch.delenv("MEGACACHE_BENCH_QUIET_WAIT_S", raising=False)
    at_rest = quiet_filesystem(str(tmp_path / "a"), threshold_s=1.0)
    assert at_rest["quiet"] and at_rest["waited_s"] < 1 and len(at_rest["create_us"]) == 1
    assert len(os.listdir(tmp_path / "a" / "filesystem-probes")) == QUIET_PROBE_FILES
    assert capsys.readouterr().out == ""
    # never cheap enough: probes every poll until the limit, then measures anyway, saying so
    busy = quiet_filesystem(str(tmp_path / "b"), threshold_s=0.0, limit_s=0.5, poll_s=0.2)
    assert not busy["quiet"] and 2 <= len(busy["create_us"]) <= 3 and busy["waited_s"] >= 0.2
    assert len(os.listdir(tmp_path / "b" / "filesystem-probes")) == QUIET_PROBE_FILES * len(busy["create_us"])
    out = capsys.readouterr().out
    assert "waiting up to 0.5 s for the deletes made before this benchmark to age out" in out, out
    assert "measuring anyway" in out, out
    # the environment's limit: one probe, no wait
    monkeypatch.setenv("MEGACACHE_BENCH_QUIET_WAIT_S", "0")
    once = quiet_filesystem(str(tmp_path / "c"), threshold_s=0.0)
    assert not once["quiet"] and len(once["create_us"]) == 1 and once["waited_s"] < 1


@pytest.mark.slow
@pytest.mark.oracle_environments
def test_sft_pack_times_both_sides_and_compares_their_bytes(tmp_path):
    from support.oracles.environments import BRIDGE_ROOT, built

    if not built(BRIDGE_ROOT):
        pytest.skip("Megatron-Bridge oracle not built: run bash tests/bridge_oracle.sh")
    output, records = benchmark(tmp_path, "benchmarks.sft_pack", "--examples", "300", "--repeats", "2")
    # alternating: Bridge first in the first pair, megacache first in the second
    assert [(r["pair"], r["side"], r["first"]) for r in records] == [
        (0, "bridge", True), (0, "megacache", False), (1, "megacache", True), (1, "bridge", False)]
    for r in records:
        assert r["identical_bytes"] > 0 and r["wall_s"] > 0 and r["packing"]["examples"] == 300, r
        assert r["commit"] and r["cores"] >= 1 and len(r["loadavg_before"]) == 3
    assert [len(r["rss_kb"]) for r in records] == [1, 2, 2, 1]
    assert re.search(r"medians of 2: Bridge [0-9.]+ s, megacache P=2 [0-9.]+ s: [0-9.]+x", output), output


@pytest.mark.slow
def test_object_storage_times_bucket_and_local_and_counts_requests(tmp_path):
    from support.systems.s3server import moto_available

    if not moto_available():
        pytest.skip("moto's S3 server is not installed: pip install 'moto[server]' (the test extra has it)")
    output, records = benchmark(tmp_path, "benchmarks.object_storage", "--megabytes", "1", "--repeats", "1")
    assert [(r["step"], r["side"], r["first"]) for r in records] == [
        (step, side, side == "local") for step in ("tokenize", "build", "build_blend") for side in ("local", "bucket")]
    for r in records:
        assert r["identical_bytes"] > 0 and r["wall_s"] > 0 and r["commit"] and len(r["cpu_s"]) == 2, r
        assert ("requests_by_kind" in r) == (r["side"] == "bucket"), r
    tokenize, build, blend = (r for r in records if r["side"] == "bucket")
    # the text listed and read, the dataset written
    assert tokenize["requests_by_kind"]["LIST"] >= 1 and tokenize["requests_by_kind"]["GET"] >= 1
    assert tokenize["bytes_downloaded"] >= tokenize["corpus_bytes"] and tokenize["bytes_uploaded"] > 0
    # a build reads each .idx once and writes nothing to the bucket
    assert (build["requests_by_kind"]["GET"], blend["requests_by_kind"]["GET"]) == (1, 2)
    assert build["bytes_uploaded"] == blend["bytes_uploaded"] == 0 and build["bytes_downloaded"] > 0
    assert not {"PUT", "multipart_part", "DELETE"} & set(build["requests_by_kind"])
    assert re.search(r"^  tokenize: local [0-9.]+ s, bucket [0-9.]+ s; bucket requests .*GET \d+", output,
                     re.MULTILINE), output
