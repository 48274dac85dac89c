"""megacache's messages when it runs as a library: the ``megacache`` logger. The command line shows
it on stderr (``show_on_stderr``); a program that embeds megacache (training calling
``prepare_cache`` under torchrun) configures or silences it as any logger, e.g.
``logging.getLogger("megacache").setLevel(logging.ERROR)``."""

from __future__ import annotations

import logging
import sys

LOG = logging.getLogger("megacache")


def show_on_stderr() -> None:
    """Every message of INFO and above on stderr, as written (the command line's own output)."""
    if not any(getattr(h, "megacache", False) for h in LOG.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        handler.megacache = True
        LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)
