"""megacache's messages when it runs as a library: the ``megacache`` logger. The command line shows
it on stderr (``show_on_stderr``); a program that embeds megacache (training calling
``prepare_cache`` under torchrun) configures or silences it as any logger, e.g.
``logging.getLogger("megacache").setLevel(logging.ERROR)``."""

from __future__ import annotations

import logging
import sys

LOG = logging.getLogger("megacache")


class _Stderr(logging.StreamHandler):
    """A handler writing to ``sys.stderr`` as it is when a message comes, not as it was when the
    handler was made: a program (or a test) that replaces stderr later still gets the messages, and
    a replaced stream that was closed is never written to."""

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value) -> None:
        pass


def show_on_stderr() -> None:
    """Every message of INFO and above on stderr, as written (the command line's own output)."""
    if not any(isinstance(h, _Stderr) for h in LOG.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("%(message)s"))
        LOG.addHandler(handler)
    LOG.setLevel(logging.INFO)


def byte_amount(n: float) -> str:
    """A number of bytes as a message shows it: ``923.9 kB``, ``3.6 GB``, ``12 B``."""
    for unit, scale in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{int(n)} B"
