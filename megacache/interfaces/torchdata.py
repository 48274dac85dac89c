"""A ``torch.utils.data.Dataset`` over an opened cache split, for plain PyTorch loops and
``DistributedSampler``: item ``k`` is sample ``k`` as an int64 tensor of ``seq_length + 1`` tokens
(inputs are ``[:-1]``, labels ``[1:]``, as in Megatron with the extra token). A dataset in a bucket
is read by ranged requests, each DataLoader worker with its own client."""

from __future__ import annotations

import torch
from torch.utils.data import Dataset

from ..readers.samples import BlendedSamples, GPTSamples


class TokenDataset(Dataset):
    def __init__(self, samples: GPTSamples | BlendedSamples):
        self.samples = samples

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, k: int) -> torch.Tensor:
        return torch.from_numpy(self.samples[int(k)])
