"""Distributed jobs composed from comm, formats and algorithms."""
