"""megacache: Megatron-exact tokenization and dataset index caches, built by every rank at once."""

__version__ = "0.1.0"
