import os

import pytest

# megatron-core warns loudly about optional CUDA extras on import; silence it for the oracle.
os.environ.setdefault("PYTHONWARNINGS", "ignore")
# Kernels through numba's JIT, whatever this machine's user has compiled, unless a test asks for
# the compiled library (the kernel_mode and compiled_kernels fixtures).
os.environ.setdefault("MEGACACHE_KERNEL_DIR", "jit")


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
    """The .pbin oracle: the modalities package, 0.5.0 (its packer and readers, tests/support/modalities.py)."""
    from importlib.metadata import version

    assert version("modalities") == "0.5.0", version("modalities")
    from support import modalities as oracle

    return oracle


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


def pytest_terminal_summary(terminalreporter):
    if REPORTS:
        terminalreporter.section("reports")
        for line in REPORTS:
            terminalreporter.write_line(line)


@pytest.fixture(scope="session")
def compiled_kernels(tmp_path_factory) -> str:
    """A directory holding megacache's kernels compiled natively for this CPU (what ``megacache
    kernels`` makes), the test run's own: compiled once, by the first pytest-xdist worker that
    needs it (tens of CPU seconds), the others waiting on a lock."""
    import fcntl

    from megacache.runtime import kernels

    base = tmp_path_factory.getbasetemp()
    run = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    directory = run / "kernels"
    with open(run / "kernels.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not os.path.exists(kernels.library_path(str(directory))):
            directory.mkdir(exist_ok=True)
            kernels.compile_library(str(directory))
    return str(directory)


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

