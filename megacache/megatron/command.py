"""A Megatron-LM training command as ``megacache build`` reads it."""

from __future__ import annotations

import os

#: every flag of each version's training parser (and of its tools/prepare_cache.py), as
#: tests/support/record_training_flags.py recorded them from that version's own code
TABLE_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "training_flags.json")
