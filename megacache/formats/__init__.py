"""On-disk formats: Megatron's .bin/.idx and .npy files written in slices (Megatron's cache names and
hashes are in ``megatron.cache``)."""
