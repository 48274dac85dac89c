"""megacache's benchmark suite: megacache under ``mpiexec -n P`` against megatron-core, one command.

Run from the repository root::

    python -m benchmarks run --suite quick|full|smoke|scale [--ranks 1,2,4,8] [--factor F ...] [--repeats N]
                             [--only WORKLOAD ...] [--results FILE]
    python -m benchmarks report [--results FILE] [--suite NAME] [--readme README.md]  # plots + TABLE.md (+ README table) from the file alone
    python -m benchmarks scale-report [--results FILE] [--doc docs/benchmarks.md]  # SCALE.md (+ that file's scale table): one workload against its size
    python -m benchmarks project [--results FILE] [--scale-results FILE] [--output FILE]   # docs/benchmarks-projection.md
    python -m benchmarks floor [--factor F] [--ranks P] [--repeats N] [--results FILE]  # the build (and megatron-core's) beside its start-up and its files alone

Workloads (``workloads.py``; sizes scale by the factor, 1 = the issue's sizes): ``tokenize`` (generated
text, a trained 32k BPE), ``build_gpt`` (one large synthetic dataset), ``build_blend`` (a
1000-dataset weighted blend) and ``blend_kernel`` (the blending kernel alone). Every run is a fresh
process timed from outside: the reference once per repeat (megatron-core, one process), then
megacache at each P; every output is compared byte for byte with the reference's. Each run writes
into a new directory; outputs of many files are deleted only when their workload ends (see
``suite._release``: on this VM's journal-less ext4, creates right after a mass delete are slow).

Modules: ``probe`` (runs a module and records its peak RSS, CPU and bytes written), ``harness``
(processes, outputs, machine, results file), ``reference`` (megatron-core's side), ``kernel``
(megacache's chunked blend under MPI), ``suite`` (the measurements), ``report``, ``project``, ``floor``
(what start-up and the output files alone cost).
This file stays import-free: every probed process imports it first.
"""
