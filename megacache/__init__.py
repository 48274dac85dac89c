"""megacache: Megatron-exact tokenization and dataset index caches, built by every rank at once.

The package, bottom up: ``errors``; ``runtime`` (communicator, coordination on the shared
filesystem, durable writes, progress, kernels); ``formats`` (the files' byte layouts);
``algorithms`` (pure numpy/numba, no I/O); ``megatron`` (its semantics per version); ``text``
(inputs and tokenizers); ``builders`` (the distributed jobs); ``readers`` (samples, verify,
inspect); ``interfaces`` (command line, Python API, torch). A module imports only from its own
package and those before it.

The Python API is also in this package, imported on first use: ``from megacache import BuildConfig,
build, open_cache, prepare_cache`` (``megacache.interfaces.api``), and ``TokenDataset`` (torch).
"""

__version__ = "0.1.0"


def __getattr__(name: str):
    from .interfaces import api

    if name in api.__all__:
        return getattr(api, name)
    if name == "TokenDataset":
        from .interfaces.torchdata import TokenDataset

        return TokenDataset
    raise AttributeError(f"module 'megacache' has no attribute {name!r}")
