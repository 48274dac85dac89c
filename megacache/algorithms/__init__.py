"""Pure algorithms on numpy arrays: no I/O, no communication."""

import sys


def import_numba_without_scipy() -> None:
    """Import numba's numpy support without its BLAS probe, which imports ``scipy.linalg`` (0.3-0.6 s
    per process here, far more from a shared filesystem, on every rank) only to enable ``np.dot``
    and friends in jitted code; megacache's kernels use none of them. Called first by megacache's
    own processes (the CLI), never by the library in someone else's: scipy still imports normally
    afterwards, and numba's linear algebra checks for it again when a function needs it."""
    if "numba.np.arraymath" in sys.modules or "scipy.linalg" in sys.modules:
        return
    sys.modules["scipy.linalg"] = None  # `import scipy.linalg...` fails at once instead of loading
    try:
        import numba.np.arraymath  # noqa: F401  (the module whose import runs the probe)
    finally:
        del sys.modules["scipy.linalg"]
