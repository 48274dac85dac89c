"""megatron-core 0.16.1 as the oracle: its GPT dataset machinery, and datasets to feed it."""

from __future__ import annotations

import os
import shutil
import tempfile
import warnings
from types import SimpleNamespace

import numpy as np

from megacache.formats.indexed import IndexLayout, IndexWriter


def load_mcore():
    """megatron-core's GPT dataset machinery and a real (null) tokenizer for its config."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        from megatron.core.datasets import blended_megatron_dataset_config, gpt_dataset, helpers
        from megatron.core.datasets.blended_megatron_dataset_builder import BlendedMegatronDatasetBuilder
        from megatron.core.tokenizers import MegatronTokenizer

    return SimpleNamespace(
        gpt=gpt_dataset,
        helpers=helpers,
        config=blended_megatron_dataset_config,
        Builder=BlendedMegatronDatasetBuilder,
        tokenizer=MegatronTokenizer.from_pretrained(metadata_path={"library": "null"}, vocab_size=1000),
    )


def megatron_datasets(mcore, sizes, seed, L, x, drop_last_valid, path_to_cache=None, sequences_file=False, **data):
    """megatron-core's ``BlendedMegatronDatasetBuilder(...).build()`` for the tests' configuration (the
    null tokenizer, no reset/eod flags); ``data`` is ``blend=(prefixes, weights), split=...`` or
    ``blend_per_split=[...]``. With ``path_to_cache`` it also writes its cache files there, and with
    ``sequences_file`` the --per-dataset-sequences-path file Megatron-LM's tool writes. Where it would
    loop forever it raises LoopsForever (``support.oracle_worker``) instead."""
    config = mcore.gpt.GPTDatasetConfig(
        random_seed=seed,
        sequence_length=L,
        tokenizer=mcore.tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        add_extra_token_to_sequence=bool(x),
        drop_last_partial_validation_sequence=drop_last_valid,
        path_to_cache=path_to_cache,
        **data,
    )
    from support.oracle_worker import stopped_where_it_loops

    with warnings.catch_warnings(), stopped_where_it_loops(mcore.gpt.GPTDataset):
        warnings.simplefilter("ignore")
        built = mcore.Builder(mcore.gpt.GPTDataset, sizes, lambda: True, config).build()
    if sequences_file:
        from support.oracle_worker import write_sequences_file

        write_sequences_file(data.get("blend"), data.get("blend_per_split"),
                             os.path.join(path_to_cache, "sequences_per_dataset.json"))
    return built


def megatron_splits(mcore, prefix, split, sizes, seed, L, x, drop_last_valid, path_to_cache=None,
                    sequences_file=False):
    """megatron-core's GPTDatasets for the three splits of ``prefix`` (None where a split is empty)."""
    return megatron_datasets(mcore, sizes, seed, L, x, drop_last_valid, path_to_cache, sequences_file,
                             blend=([prefix], None), split=split)


def write_lengths(prefix, lengths, dtype: str = "uint16", documents=None):
    """A dataset of these sequence lengths, zero-length ones included, its tokens ``dtype`` (uint16
    as Megatron stores a vocabulary under 65,500 tokens, int32 above), its documents starting at the
    sequence indices ``documents`` (0 to the count; by default one sequence per document). The
    .bin is sparse: the index arrays depend on lengths only."""
    lengths = np.asarray(lengths, dtype=np.int32)
    documents = np.arange(len(lengths) + 1) if documents is None else np.asarray(documents, dtype=np.int64)
    token = np.dtype(dtype)
    layout = IndexLayout(token, len(lengths), len(documents))
    IndexWriter.create(prefix + ".idx", prefix + ".bin", layout, token.itemsize * max(1, int(lengths.sum())))
    with IndexWriter.open(prefix + ".idx", prefix + ".bin", layout) as w:
        w.write_sequences(0, lengths, 0)
        w.write_documents(0, documents)


def random_lengths(rng, count):
    """Sequence lengths of several shapes: uniform, long-tailed, many empty, a few huge."""
    kind = int(rng.integers(0, 4))
    if kind == 0:
        lengths = rng.integers(1, 50, count)
    elif kind == 1:
        lengths = rng.geometric(1 / 200, count)
    elif kind == 2:
        lengths = np.where(rng.random(count) < 0.25, 0, rng.integers(0, 100, count))
    else:
        lengths = rng.integers(0, 30, count)
        lengths[rng.integers(0, count, 3)] = rng.integers(10**4, 10**5, 3)
    return lengths.astype(np.int32)




def sweep_configurations(comm, configurations, run) -> dict[str, int]:
    """``run(workdir, c)`` for each configuration in a fresh shared directory; counts of the labels
    it returns."""
    outcomes: dict[str, int] = {}
    for c in configurations:
        # Rank 0 alone deletes, creates and (in ``run``) runs the oracle: MPICH's blocking calls poll
        # at full speed, so the other ranks wait quietly rather than take its core.
        comm.wait_quietly()
        workdir = comm.bcast(tempfile.mkdtemp(prefix="megacache-sweep-") if comm.rank == 0 else None)
        try:
            label = run(workdir, c)
        finally:
            comm.wait_quietly()
            if comm.rank == 0:
                shutil.rmtree(workdir)
        outcomes[label] = outcomes.get(label, 0) + 1
    return outcomes
