"""Helpers shared by the test tiers, by role: ``oracles`` (the real packages run as references, the
scripts they run and the recorders of their answers), ``inputs`` (corpora, datasets, tokenizer files
and commands), ``systems`` (the cluster, faults, S3 server, torchrun ranks and venvs the tests run
megacache under) and ``sweeps`` (the conformance sweeps); the few helpers every tier uses are below."""

import contextlib
import shutil
import tempfile


def run_cli(argv: list[str], capsys) -> tuple[int, str]:
    """``megacache argv`` in this process: its exit status (argparse's errors included) and stderr."""
    from megacache.interfaces import cli

    try:
        status = cli.main(argv)
    except SystemExit as exc:  # argparse's errors
        status = exc.code
    return status, capsys.readouterr().err


def without_mpi(env: dict) -> dict:
    """``env`` less an MPI launcher's variables: a process started with it is not a rank of the
    world this test may run in (megacache would otherwise join it)."""
    from megacache.runtime.comm import MPI_LAUNCHER_VARS

    return {k: v for k, v in env.items() if k not in MPI_LAUNCHER_VARS}


@contextlib.contextmanager
def shared_directory(comm, prefix: str):
    """A fresh directory for every rank of ``comm``: rank 0 makes it, and removes it once every rank
    is done with it."""
    path = comm.bcast(tempfile.mkdtemp(prefix=prefix) if comm.rank == 0 else None)
    try:
        yield path
    finally:
        comm.barrier()
        if comm.rank == 0:
            shutil.rmtree(path)
