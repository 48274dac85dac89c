"""Samples from a built cache, exactly as megatron-core (0.16 to 0.19) reads them (docs/megatron.md §2.10,
§4.3), from memory maps, in O(1) per sample (plus the documents a sample spans).

``GPTSamples[k]`` is the raw token window of ``GPTDataset._query_document_sample_shuffle_indices(k)``:
``seq_length + add_extra_token`` int64 tokens across document boundaries, the last partial
sample padded with the pad id; ``document_ids(k)`` the documents it reads. ``BlendedSamples[k]`` is
``GPTSamples[dataset_sample_index[k]]`` of dataset ``dataset_index[k]``.
"""

from __future__ import annotations

import numpy as np

from ..megatron.cache import CacheEntry
from ..formats.indexed import IndexedDataset
from ..formats.npy import load_npy

#: megatron-core's pad id when the tokenizer has none
NO_PAD = -1


class GPTSamples:
    """One GPTDataset cache entry over its ``.bin/.idx``."""

    def __init__(self, dataset: IndexedDataset, entry: CacheEntry, add_extra_token: bool = True,
                 pad_id: int = NO_PAD):
        self.dataset, self.entry = dataset, entry
        self.seq_length = int(entry.identifiers["sequence_length"])
        self.add_extra_token = int(add_extra_token)
        self.pad_id = pad_id
        self.document_index = load_npy(entry.path("document_index.npy"))
        self.sample_index = load_npy(entry.path("sample_index.npy"))
        self.shuffle_index = load_npy(entry.path("shuffle_index.npy"))

    def __len__(self) -> int:
        return self.sample_index.shape[0] - 1

    def _bounds(self, k: int) -> tuple[int, int, int, int]:
        if not -len(self) <= k < len(self):
            raise IndexError(f"sample {k} of {len(self)}")
        j = int(self.shuffle_index[k])
        (i0, o0), (i1, o1) = self.sample_index[j], self.sample_index[j + 1]
        return int(i0), int(o0), int(i1), int(o1)

    def sample(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        """``(tokens int64[L + x], document ids int64[])`` of sample ``k``."""
        i0, o0, i1, o1 = self._bounds(k)
        x = self.add_extra_token
        docs = self.document_index[i0: i1 + 1]
        if i0 == i1:
            pieces = [self.dataset.get(int(docs[0]), o0, o1 - o0 + x)]
        else:
            pieces = [self.dataset.get(int(docs[0]), o0)]
            pieces += [self.dataset.get(int(d)) for d in docs[1:-1]]
            pieces.append(self.dataset.get(int(docs[-1]), 0, o1 + x))
        tokens = np.full(self.seq_length + x, self.pad_id, dtype=np.int64)
        text = np.concatenate(pieces) if len(pieces) > 1 else pieces[0]
        tokens[: len(text)] = text
        return tokens, docs.astype(np.int64)

    def __getitem__(self, k: int) -> np.ndarray:
        return self.sample(k)[0]

    def document_ids(self, k: int) -> np.ndarray:
        i0, _, i1, _ = self._bounds(k)
        return self.document_index[i0: i1 + 1].astype(np.int64)


class BlendedSamples:
    """One BlendedDataset cache entry over its children."""

    def __init__(self, children: list[GPTSamples], entry: CacheEntry):
        self.children, self.entry = children, entry
        self.dataset_index = load_npy(entry.path("dataset_index.npy"))
        self.dataset_sample_index = load_npy(entry.path("dataset_sample_index.npy"))

    def __len__(self) -> int:
        return self.dataset_index.shape[0]

    def source(self, k: int) -> tuple[int, int]:
        """``(dataset id, sample of that dataset)`` that blended sample ``k`` reads."""
        if not -len(self) <= k < len(self):
            raise IndexError(f"sample {k} of {len(self)}")
        return int(self.dataset_index[k]), int(self.dataset_sample_index[k])

    def sample(self, k: int) -> tuple[np.ndarray, np.ndarray]:
        d, s = self.source(k)
        return self.children[d].sample(s)

    def __getitem__(self, k: int) -> np.ndarray:
        return self.sample(k)[0]

    def document_ids(self, k: int) -> np.ndarray:
        d, s = self.source(k)
        return self.children[d].document_ids(s)
