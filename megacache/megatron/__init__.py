"""Megatron-LM's semantics, per supported megatron-core version: which versions there are and how one
is chosen (``versions``), and the tokenizer identity its training hashes into every cache name, with
the command-line flags that decide it (``tokenizer``). A later Megatron is one new entry in
``versions.SUPPORTED`` plus the rows of the tables that changed in it."""
