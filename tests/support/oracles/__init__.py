"""The real packages the tests check megacache against, run as references: megatron-core 0.16.1 in
this process (``megatron_core``); every megatron-core version and Megatron-Bridge in its own
interpreter (``environments``, which runs the scripts of this folder there: ``megatron_worker``,
``megatron_rank``, the ``bridge_*`` workers); Megatron-LM's own tools and training start on a CPU
(``prepare_cache_cpu``, ``training_datasets_cpu``); datatrove, Modalities and OLMo-core
(``datatrove``, ``modalities``, ``olmo``); and the ``record_*`` scripts that write what Megatron-LM
answered into tests/data and megacache/megatron/training_flags.json."""
