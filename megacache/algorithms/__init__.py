"""Pure algorithms on numpy arrays: no I/O, no communication."""
