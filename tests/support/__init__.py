"""Helpers shared by the test tiers: oracles, corpora, sweeps."""
