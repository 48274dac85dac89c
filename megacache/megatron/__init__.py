"""Megatron-LM's semantics, in one place, per supported megatron-core version:

* ``versions``: the versions megacache reproduces (0.16 to 0.19, and 0.20: Megatron-LM main) and which
  one a run follows;
* ``flags``: Megatron-LM flags as data (which versions have each, its default);
* ``tokenizer``: the tokenizer identity training hashes into every cache name, from its flags;
* ``training``: the samples training asks of each split, from its flags; the default split;
* ``blends``: the data flags (``--data-path`` and the per-split forms) parsed into blends;
* ``cache``: descriptions, their md5, the cache file names and the cache-hit rule;
* ``sequences``: the ``--per-dataset-sequences-path`` file.

Supporting a later Megatron is one new entry in ``versions.SUPPORTED`` plus the flag rows and rules
that changed in it (each rule that differs names the version it starts at: ``at_least(v, "0.18")``).
"""
