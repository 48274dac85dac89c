"""The text side: reading documents from jsonl, parquet and text inputs (``inputs``), Megatron's
tokenizers reproduced id for id (``tokenization``) and the engines that run them
(``backends``), and the bundled sample corpus (``sample_corpus``)."""
