"""On-disk formats: Megatron's .bin/.idx, .npy files written in slices, cache names and hashes."""
