"""The cluster runtime: the communicator over MPI, torch.distributed or one process
(``comm``); the job's lock, heartbeats and agreed phases on the shared filesystem
(``coordination``); atomic, durable file writes (``fsio``); progress and logging; the environment
variables megacache reads (``environment``); and how the numba kernels run, natively compiled or
JIT (``kernels``)."""
