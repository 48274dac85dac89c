"""Helpers shared by the test tiers: oracles, corpora, sweeps."""


def without_mpi(env: dict) -> dict:
    """``env`` less an MPI launcher's variables: a process started with it is not a rank of the
    world this test may run in (megacache would otherwise join it)."""
    from megacache.runtime.comm import MPI_LAUNCHER_VARS

    return {k: v for k, v in env.items() if k not in MPI_LAUNCHER_VARS}
