import os

import pytest

# megatron-core warns loudly about optional CUDA extras on import; silence it for the oracle.
os.environ.setdefault("PYTHONWARNINGS", "ignore")
#: the kernels every test runs unless it asks otherwise (the kernel_mode fixture, the sweeps' JIT
#: sample): the compiled library, as users run them after `megacache kernels`, compiled for this
#: CPU once per machine and kernel sources (its name is their digest); a MEGACACHE_KERNEL_DIR set
#: by whoever runs the tests is kept
KERNELS = os.path.join(os.path.expanduser("~"), ".cache", "megacache", "test-kernels")


def pytest_configure(config):
    if "MEGACACHE_KERNEL_DIR" not in os.environ:
        os.environ["MEGACACHE_KERNEL_DIR"] = compile_kernels(KERNELS)


def compile_kernels(directory: str) -> str:
    """A directory under ``directory`` holding the kernels compiled for this CPU and these sources,
    and nothing else of the kind (named by the library's digest, so that checkouts of other sources
    tested at the same time keep theirs): compiled by the first process of the run that gets there
    (an xdist worker or an MPI rank), the others waiting on a lock. Those no run has used for a week
    go."""
    import fcntl
    import shutil
    import time

    from megacache.runtime import kernels

    name = os.path.basename(kernels.library_path(directory)).split(".", 1)[0]
    mine = os.path.join(directory, name)
    os.makedirs(mine, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(kernels.library_path(mine)):
            kernels.compile_library(mine)
            kernels.forget_library()
        os.utime(mine)
        for other in os.scandir(directory):
            if other.is_dir() and other.name != name and time.time() - other.stat().st_mtime > 7 * 86400:
                shutil.rmtree(other.path, ignore_errors=True)
    return mine


@pytest.fixture(scope="session")
def megatron():
    """The oracle: megatron-core 0.16.1's datasets package (imported once; it is slow to import)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import indexed_dataset

    import megatron.core

    assert megatron.core.__version__ == "0.16.1", megatron.core.__version__
    return indexed_dataset


@pytest.fixture(scope="session")
def modalities():
    """The .pbin oracle: the modalities package, 0.5.0 (its packer and readers, tests/support/oracles/modalities.py)."""
    from importlib.metadata import version

    assert version("modalities") == "0.5.0", version("modalities")
    from support.oracles import modalities as oracle

    return oracle


@pytest.fixture(scope="session")
def datatrove():
    """The .ds oracle: the datatrove package, 0.10.1 (its tokenizer step and reader,
    tests/support/oracles/datatrove.py)."""
    from importlib.metadata import version

    assert version("datatrove") == "0.10.1", version("datatrove")
    from support.oracles import datatrove as oracle

    return oracle


@pytest.fixture(scope="session")
def olmo():
    """The OLMo oracle: the ai2-olmo-core package, 3.0.0 (its numpy datasets, tests/support/oracles/olmo.py)."""
    from importlib.metadata import version

    assert version("ai2-olmo-core") == "3.0.0", version("ai2-olmo-core")
    from support.oracles import olmo as oracle

    return oracle


@pytest.fixture
def megacache(capsys):
    """``megacache ARGS`` on ``ranks`` ranks: one rank in this process (no interpreter to start), more
    under mpiexec. Returns the exit code and what it printed."""
    from megacache.interfaces.cli import main
    from support.inputs.corpus import run_megacache

    def run(ranks: int, *args: str, check: bool = True) -> tuple[int, str, str]:
        if ranks > 1:
            proc = run_megacache(ranks, *args, check=check)
            return proc.returncode, proc.stdout, proc.stderr
        code = main(list(args))
        out = capsys.readouterr()
        assert code == 0 or not check, out.out + out.err
        return code, out.out, out.err
    return run


@pytest.fixture(autouse=True)
def library_logging():
    """Each test starts from the library's logging as an importing program finds it (no handler,
    no level): the command line run in this process (``cli.main``), by a test or a module fixture,
    sets the ``megacache`` logger up to print on stderr."""
    import logging

    log = logging.getLogger("megacache")
    log.handlers.clear()
    log.setLevel(logging.NOTSET)
    yield
    log.handlers.clear()
    log.setLevel(logging.NOTSET)


#: lines tests asked for in the run's summary, gathered from their reports (which pytest-xdist
#: sends from its workers to the process that prints the summary)
REPORTS: list[str] = []


@pytest.fixture
def report(request):
    """``report(line)``: a line for the run's summary whether the test passes or not (the
    fault-injection trial counts)."""
    return lambda line: request.node.user_properties.append(("report", line))


def pytest_runtest_logreport(report):
    if report.when == "teardown":
        REPORTS.extend(line for key, line in report.user_properties if key == "report")
    if RANKS and report.when == "call" and report.passed and "mpi" in report.keywords:
        MPI_RAN.append(report.nodeid)
    if RANKS and report.skipped and "mpi" in report.keywords:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        if "not built" not in reason:
            MPI_SKIPS.append(f"{report.nodeid}: {reason}")


def pytest_terminal_summary(terminalreporter):
    if RANKS:
        if _mpi_rank() == 0:
            terminalreporter.write_line(f"MPI tier: a world of {RANKS} ranks, as launched; {len(MPI_RAN)} MPI tests "
                                        f"passed on rank 0, {len(MPI_SKIPS)} skipped")
    if REPORTS:
        terminalreporter.section("reports")
        for line in REPORTS:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def compiled_kernels() -> str:
    """A directory holding megacache's kernels compiled natively for this CPU (what ``megacache
    kernels`` makes), and only them."""
    return compile_kernels(KERNELS)


@pytest.fixture(params=["jit", "native"])
def kernel_mode(request, monkeypatch):
    """Run the test's kernels through numba's JIT, then again from the compiled library; in the
    latter, no call whose types were compiled may have gone to the JIT."""
    from megacache.runtime import kernels

    native = request.param == "native"
    monkeypatch.setenv("MEGACACHE_KERNEL_DIR", request.getfixturevalue("compiled_kernels") if native else "jit")
    kernels.forget_library()
    try:
        assert (kernels.native_library() is not None) is native
        yield request.param
        if native:
            strays = [(k, key) for k, key in kernels.jit_calls() if key in k.compiled_keys()]
            assert not strays, f"compiled signatures ran through the JIT: {strays}"
    finally:
        kernels.forget_library()


def pytest_collection_modifyitems(items):
    """The tests that need the Python 3.12 oracle environments run last in each tier: tests/run_all.sh
    builds those in the background, and such a test waits for them (support.oracles.environments.built)."""
    items.sort(key=lambda item: item.get_closest_marker("oracle_environments") is not None)


#: the MPI tiers of tests/run_all.sh set this to the ranks they launch
RANKS = os.environ.get("MEGACACHE_TEST_RANKS")
#: MPI tests that skipped for a reason other than a missing oracle environment, and those that passed
MPI_SKIPS: list[str] = []
MPI_RAN: list[str] = []


def pytest_sessionstart(session):
    """An MPI tier runs in a world of the ranks it launched: where mpiexec and mpi4py's MPI library
    disagree, every process sees a world of one, and pytest-mpi would skip every MPI test and pass."""
    if RANKS:
        from mpi4py import MPI

        size = MPI.COMM_WORLD.Get_size()
        if size != int(RANKS):
            pytest.exit(f"launched as {RANKS} MPI ranks, this process sees a world of {size}: mpiexec and "
                        f"mpi4py's MPI library are not the same MPI", returncode=3)


def pytest_sessionfinish(session, exitstatus):
    """In an MPI tier, an MPI test that skipped (but for an oracle environment not built) fails it.
    The run's last process removes the shared-memory segments of MPI jobs the tests killed."""
    if MPI_SKIPS and exitstatus == 0:
        print("\nMPI tests skipped in an MPI tier:\n" + "\n".join(MPI_SKIPS))
        session.exitstatus = 1
    if not os.environ.get("PYTEST_XDIST_WORKER") and not (RANKS and _mpi_rank()):
        remove_orphaned_segments()


def _mpi_rank() -> int:
    from mpi4py import MPI

    return MPI.COMM_WORLD.Get_rank()


def remove_orphaned_segments(shm: str = "/dev/shm", older_than_s: float = 60.0) -> list[str]:
    """MPICH's ``mpich_shm_*`` segments that no live process maps and that are older than a job's
    start: left in memory (tmpfs) by the ranks the crash tests kill with SIGKILL, which never unmap
    or unlink them. A job that is starting has mapped its own within milliseconds."""
    import glob
    import time

    mapped = set()
    for maps in glob.glob("/proc/[0-9]*/maps"):
        try:
            with open(maps) as f:
                mapped.update(line.split(None, 5)[-1].strip() for line in f if "mpich_shm_" in line)
        except OSError:  # the process ended
            continue
    removed = []
    for path in glob.glob(os.path.join(shm, "mpich_shm_*")):
        try:
            if path not in mapped and time.time() - os.stat(path).st_mtime > older_than_s:
                os.remove(path)
                removed.append(path)
        except OSError:
            continue
    return removed
