"""Reading what was built: samples from a cache exactly as megatron-core reads them (``samples``),
full consistency checks of datasets and caches (``verify``) and readable summaries (``inspection``)."""
