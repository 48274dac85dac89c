"""megatron-core 0.16.1, this process's own, as the oracle: its GPT dataset machinery."""

from __future__ import annotations

import os
import warnings
from types import SimpleNamespace


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


def megatron_datasets(mcore, sizes, seed, seq_length, add_extra_token, drop_last_partial_validation,
                      path_to_cache=None, sequences_file=False, **data):
    """megatron-core's ``BlendedMegatronDatasetBuilder(...).build()`` for the tests' configuration (the
    null tokenizer, no reset/eod flags); ``data`` is ``blend=(prefixes, weights), split=...`` or
    ``blend_per_split=[...]``. With ``path_to_cache`` it also writes its cache files there, and with
    ``sequences_file`` the --per-dataset-sequences-path file Megatron-LM's tool writes. Where it would
    loop forever it raises LoopsForever (``support.oracles.megatron_worker``) instead."""
    config = mcore.gpt.GPTDatasetConfig(
        random_seed=seed,
        sequence_length=seq_length,
        tokenizer=mcore.tokenizer,
        reset_position_ids=False,
        reset_attention_mask=False,
        eod_mask_loss=False,
        add_extra_token_to_sequence=bool(add_extra_token),
        drop_last_partial_validation_sequence=drop_last_partial_validation,
        path_to_cache=path_to_cache,
        **data,
    )
    from support.oracles.megatron_worker import stopped_where_it_loops

    with warnings.catch_warnings(), stopped_where_it_loops(mcore.gpt.GPTDataset):
        warnings.simplefilter("ignore")
        built = mcore.Builder(mcore.gpt.GPTDataset, sizes, lambda: True, config).build()
    if sequences_file:
        from support.oracles.megatron_worker import write_sequences_file

        write_sequences_file(data.get("blend"), data.get("blend_per_split"),
                             os.path.join(path_to_cache, "sequences_per_dataset.json"))
    return built


def megatron_splits(mcore, prefix, split, sizes, seed, seq_length, add_extra_token, drop_last_partial_validation,
                    path_to_cache=None, sequences_file=False):
    """megatron-core's GPTDatasets for the three splits of ``prefix`` (None where a split is empty)."""
    return megatron_datasets(mcore, sizes, seed, seq_length, add_extra_token, drop_last_partial_validation,
                             path_to_cache, sequences_file, blend=([prefix], None), split=split)
