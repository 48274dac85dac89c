"""``python faulty_gigatoken.py MARKER ARGS...``: the ``megacache ARGS...`` command with a wrong
gigatoken, for tests of the exactness guard in real (mpiexec) runs: gigatoken's first id of every
non-empty document that contains MARKER is made wrong (one more)."""

import sys

import numpy as np

from megacache.text import backends
from megacache.interfaces import cli

MARKER = sys.argv.pop(1)
_encode_batch = backends.GigatokenTokenizer.encode_batch


def encode_batch(self, texts):
    ids, lengths = _encode_batch(self, texts)
    hit = np.fromiter((MARKER in t for t in texts), bool, len(texts)) & (lengths > 0)
    if hit.any():
        ids = ids.astype(np.int64)
        ids[(np.cumsum(lengths) - lengths)[hit]] += 1
    return ids, lengths


backends.GigatokenTokenizer.encode_batch = encode_batch
cli.run()
