"""What a megacache process does first, before the work: start-up choices for its own processes
(the command line, the benchmarks), never for the library inside someone else's."""

from __future__ import annotations

import os
import sys


def single_threaded_blas() -> None:
    """megacache never calls BLAS; without this, numpy's OpenBLAS starts a spinning thread per core
    in every rank, which competes with the ranks themselves at start-up. Call it when a process
    starts, before it imports numpy; importing this module changes nothing."""
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def import_numba_for_kernels() -> None:
    """Import numba for megacache's kernels without two things they never use, which every rank
    would pay for: the BLAS probe of numba's numpy support, which imports ``scipy.linalg`` (a heavy
    import, heavier from a shared filesystem) only to enable ``np.dot`` and friends in jitted code;
    and third-party numba extensions (``numba_extensions`` entry points), which numba imports before
    the first kernel loads: awkward, a dependency of gigatoken, registers one, and its import delays
    every rank's first kernel. For megacache's own processes (this CLI), never the library in
    someone else's: scipy still imports normally afterwards, and numba's linear algebra checks for
    it again when a function needs it."""
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        return
    sys.modules["scipy.linalg"] = None  # `import scipy.linalg...` fails at once instead of loading
    try:
        import numba.np.arraymath  # noqa: F401  (the module whose import runs the probe)
    finally:
        del sys.modules["scipy.linalg"]
    import numba.core.entrypoints

    numba.core.entrypoints._already_initialized = True  # what numba sets once it has loaded them


def load_kernels() -> bool:
    """The compiled kernels loaded (True), or else numba's JIT imported as ``import_numba_for_kernels``
    does (False): first thing in a process that runs kernels on every rank."""
    from .kernels import native_library

    if native_library() is not None:
        return True
    import_numba_for_kernels()
    return False


def hide_torch_from_transformers() -> None:
    """transformers imports torch whenever it is installed (a heavy import, heavier from a shared
    filesystem, on every rank), though a tokenizer never uses it. For a tokenize process of
    megacache's own (the command line, never the library in someone else's process) torch is
    hidden before transformers loads, and transformers' notice that it found none is silenced."""
    if "torch" in sys.modules or "transformers" in sys.modules:
        return
    sys.modules["torch"] = None  # `import torch` fails at once; find_spec("torch") finds nothing
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
