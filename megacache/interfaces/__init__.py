"""The user surfaces: the command line (``cli``, and ``clidoc`` that writes its reference), the
Python API (``api``) and a torch ``Dataset`` over an opened cache (``torchdata``)."""
