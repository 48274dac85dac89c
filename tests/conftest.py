import os

import pytest

# megatron-core warns loudly about optional CUDA extras on import; silence it for the oracle.
os.environ.setdefault("PYTHONWARNINGS", "ignore")


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


#: lines a test wants in the run's output whether it passes or not (the fault-injection trial counts)
REPORTS: list[str] = []


def pytest_terminal_summary(terminalreporter):
    if REPORTS:
        terminalreporter.section("reports")
        for line in REPORTS:
            terminalreporter.write_line(line)
