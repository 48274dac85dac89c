"""The environment variables megacache reads: each read in this module, once documented
(``VARIABLES`` is what ``megacache --help`` lists)."""

from __future__ import annotations

import os

from ..errors import MegacacheError

#: name -> what it says, for the command line's description
VARIABLES = {
    "MEGACACHE_COMM": "mpi, torch or single: the communicator (default: a torch process group if one is "
                      "initialised, else MPI under an MPI launcher, else one process)",
    "MEGACACHE_KERNEL_DIR": "where `megacache kernels` puts the compiled kernels and builds look for them "
                            "(default $XDG_CACHE_HOME/megacache/kernels, i.e. ~/.cache/megacache/kernels); "
                            "jit runs them through numba's JIT",
    "MEGACACHE_HEARTBEAT_S": "seconds between a job's heartbeats on the shared filesystem (default 5)",
    "MEGACACHE_STALE_S": "seconds without a heartbeat before a lock holder or a rank on another machine "
                         "counts as dead (default 120)",
    "MEGACACHE_UPLOAD_PART_BYTES": "bytes a part of a dataset uploaded to s3:// in parts holds at least "
                                   "(default 64 MiB; S3 refuses parts under 5 MiB)",
}


def usable_cores() -> int:
    """The cores this process may run on (its CPU affinity, where the OS tells it)."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def comm_kind() -> str | None:
    """``MEGACACHE_COMM``, or None when unset."""
    return os.environ.get("MEGACACHE_COMM") or None


def kernel_dir() -> str | None:
    """``MEGACACHE_KERNEL_DIR`` as a directory; None for ``jit`` (every kernel through the JIT)."""
    d = os.environ.get("MEGACACHE_KERNEL_DIR")
    if d == "jit":
        return None
    if d:
        return os.path.abspath(d)
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return os.path.join(cache, "megacache", "kernels")


def heartbeat_s() -> float:
    return _seconds("MEGACACHE_HEARTBEAT_S", 5.0)


def stale_s() -> float:
    """How long without a heartbeat before a holder or rank on another machine counts as dead."""
    return _seconds("MEGACACHE_STALE_S", 120.0)


def upload_part_bytes() -> int:
    """The least size of a part of a multipart upload but the last."""
    value = os.environ.get("MEGACACHE_UPLOAD_PART_BYTES", str(64 << 20))
    try:
        size = int(value)
    except ValueError:
        size = 0
    if size < 1:
        raise MegacacheError(f"$MEGACACHE_UPLOAD_PART_BYTES={value!r}: expected a positive number of bytes")
    return size


def _seconds(name: str, default: float) -> float:
    value = os.environ.get(name)
    if value is None:
        return default
    try:
        seconds = float(value)
    except ValueError:
        raise MegacacheError(f"${name}={value!r}: expected a number of seconds") from None
    if not seconds > 0:
        raise MegacacheError(f"${name}={value!r}: expected a positive number of seconds")
    return seconds
