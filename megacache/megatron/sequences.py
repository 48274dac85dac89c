"""The JSON that Megatron-LM training reads with ``--per-dataset-sequences-path`` (written by its
``tools/build_sequences_per_dataset.py``): every prefix of the data flags, in order of first
appearance (the blend's, then the train, valid and test blends'), mapped to the ``(sequence count,
document count)`` of its ``.idx`` header (the document count is one more than the documents: the
header counts the document index's entries). With it, megatron-core opens no ``.idx`` header per
prefix at start-up; it then takes the token dtype from the tokenizer's vocabulary size instead of the
header. Same in every supported version."""

from __future__ import annotations

import json
import os

#: the file ``megacache build`` writes into the cache directory
FILE_NAME = "sequences_per_dataset.json"


def default_path(cache_dir: str | None) -> str | None:
    return None if cache_dir is None else os.path.join(cache_dir, FILE_NAME)


def sequences_json(counts: dict[str, tuple[int, int]]) -> bytes:
    """``json.dump(counts, f)`` as the tool writes it (default separators, tuples as lists)."""
    return json.dumps({prefix: [int(s), int(d)] for prefix, (s, d) in counts.items()}).encode()
