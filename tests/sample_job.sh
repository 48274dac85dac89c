#!/usr/bin/env bash
# The main job end to end on the bundled sample corpus, 2 MPI ranks: compile the kernels for this
# CPU (once; later runs find them), write the corpus, tokenize it, build the Megatron cache, verify
# both. Outputs under sample_out/ (or the directory given).
set -euo pipefail
OUT="${1:-sample_out}"
# The compiled kernels only make the start faster: without a C compiler numba's JIT runs the same
# code, with the same bytes.
megacache kernels || echo "sample_job.sh: the kernels were not compiled (above); builds run them through numba's JIT" >&2
megacache sample-corpus --output-dir "$OUT/corpus"
mpiexec -n 2 megacache tokenize --input "$OUT/corpus" --output-prefix "$OUT/sample" --tokenizer byte --append-eod
mpiexec -n 2 megacache build --data-path "$OUT/sample_text_document" --seq-length 256 --train-iters 500 \
    --global-batch-size 8 --eval-iters 5 --eval-interval 100 --tokenizer-type NullTokenizer --vocab-size 257 \
    --data-cache-path "$OUT/cache"
mpiexec -n 2 megacache verify "$OUT/sample_text_document" "$OUT/cache" --vocab-size 257
