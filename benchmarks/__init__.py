"""megacache's benchmark suite: megacache under ``mpiexec -n P`` against megatron-core, one command.

Run from the repository root::

    python -m benchmarks run --suite quick|full|smoke|scale [--ranks 1,2,4,8] [--factor F ...] [--repeats N]
                             [--only WORKLOAD ...] [--results FILE]
    python -m benchmarks run --suite start|start-smoke [--factor F ...] [--repeats N] [--configs a b c api]
                             [--results FILE]   # training's start on 2 gloo ranks, without and with the cache
    python -m benchmarks start-report [--results FILE] [--readme README.md]  # START.md (+ the README's start table)
    python -m benchmarks report [--results FILE] [--suite NAME] [--readme README.md]  # plots + TABLE.md (+ README table) from the file alone
    python -m benchmarks scale-report [--results FILE] [--doc docs/benchmarks.md]  # SCALE.md (+ that file's scale table): one workload against its size
    python -m benchmarks project [--results FILE] [--scale-results FILE] [--output FILE]   # docs/benchmarks-projection.md
    python -m benchmarks floor [--factor F] [--ranks P] [--repeats N] [--results FILE]  # the build (and megatron-core's) beside its start-up and its files alone
    python -m benchmarks run --suite seed [--factor F] [--ranks P] [--results FILE]  # the seed's case, 5e12 tokens (seed.py)
    python -m benchmarks.seed report [--results FILE] [--doc docs/benchmarks.md]  # SEED.md (+ that file's seed table)
    python -m benchmarks prepare --megatron-lm VERSION=TREE ... --python PY [--only WORKLOAD ...] [--factor F ...]
                                 [--readme README.md]   # against Megatron-LM's tools/prepare_cache.py (prepare.py)
    python -m benchmarks.prepare report [--results FILE] [--readme README.md]  # PREPARE.md (+ the README's table)
    python -m benchmarks ab REV_A REV_B [--workload W] [--factor F] [--ranks P] [--pairs N]  # two commits of
                                  # megacache on one build, alternating (ab.py)
    python -m benchmarks.sft_pack [--examples N] [--ranks P] [--workers W] [--repeats N]  # against Megatron-Bridge's
                                  # packed SFT preparation (sft_pack.py)
    python -m benchmarks.object_storage [--megabytes MB] [--ranks P] [--repeats N]  # tokenize and build from
                                  # moto's S3 server beside local disk, requests and bytes (object_storage.py)

Workloads (``workloads.py``; sizes scale by the factor, 1 = the issue's sizes): ``tokenize`` (generated
text, a trained 32k BPE), ``build_gpt`` (one large synthetic dataset), ``build_blend`` (a
1000-dataset weighted blend) and ``blend_kernel`` (the blending kernel alone). Every run is a fresh
process timed from outside: the reference once per repeat (megatron-core, one process), then
megacache at each P; every output is compared byte for byte with the reference's. Each run writes
into a new directory; outputs of many files are deleted only when their workload ends (see
``suite._release``: on this VM's journal-less ext4, creates right after a mass delete are slow).

The start suites (``start.py``, ``start_rank.py``) measure training's start instead: megatron-core
0.19.2 on 2 gloo ranks building or loading the 1000-dataset blend's indices without a cache, with
megacache's cache, and with it and the fast-load flags, beside megacache's own ``prepare_cache``; per
rank the seconds to sample 0, the files opened and the peak RSS.

Modules: ``probe`` (runs a module and records its peak RSS, CPU and bytes written), ``harness``
(processes, outputs, machine, results file), ``reference`` (megatron-core's side), ``kernel``
(megacache's chunked blend under MPI), ``suite`` (the measurements), ``report``, ``project``, ``floor``
(what start-up and the output files alone cost, and the disk's own write rate), ``seed`` (the seed's
case: one build at 5e12 tokens with its checks at that scale), ``prepare`` (against Megatron-LM's own
``tools/prepare_cache.py``), ``sft_pack`` (``megacache pack`` against Megatron-Bridge's preparation of
packed SFT files), ``object_storage`` (tokenize and build from a bucket beside the same work on local
disk).
This file stays import-free: every probed process imports it first.
"""
