"""Runs Megatron-LM's tools/prepare_cache.py on a machine without a GPU: ``python prepare_cache_cpu.py
TOOL ARGS...``. Its validate_args asks the GPU's architecture when tensor or context parallelism is
above 1 (only to choose a warning about CUDA_DEVICE_MAX_CONNECTIONS); this script's one stand-in answers
for a Hopper GPU, as on the clusters such commands come from. Nothing else is changed."""

import runpy
import sys

import megatron.training.arguments as arguments

arguments.get_device_arch_version = lambda: 9
sys.argv = sys.argv[1:]
runpy.run_path(sys.argv[0], run_name="__main__")
