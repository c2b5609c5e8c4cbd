#!/usr/bin/env bash
# The GPU checks, each ours against its baseline in one run: `embed`, our encoder path (PyTorch
# FP16 on CUDA, gated against FP32) against sentence-transformers FP16 on CUDA, through
# `precompute bench embed`; `sequence`, the sequence model's training on the GPU against the
# same training on the machine's CPU cores (precompute/bench/recs/sequence_device.py). Arguments:
# the parts to run (default: both).
#
# Made for the GPU test machine (../shared/GPU.md): it has torch, transformers,
# sentence-transformers, tokenizers, onnx, onnxruntime and pyarrow, and no network, no pydantic
# and no bundled model. So the pydantic wheels travel in .gpu/wheels, this package is installed
# from the checkout without its dependencies, and the model is the bundled one saved in FP16 by
# sentence-transformers here (.gpu/model; `make gpu-check-files` writes both).
set -euo pipefail
out=${OUT:-/tmp/gpu-check}
mkdir -p "$out"
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .gpu/wheels/*.whl
python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile --target /tmp/site .
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true
export PRECOMPUTE_ENGINE_DEVICE=cuda PRECOMPUTE_ENGINE_CACHE_DIR=/tmp/engines
repo=$PWD
export PRECOMPUTE_BENCH_RESULTS="$out"  # each bench's record, brought back with $OUT into bench/results/
cd /tmp  # the checkout's own precompute/ would shadow the installed package
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
python3 -c "from precompute.models.hardware import detect_device; print('device auto:', detect_device())"
parts=${*:-embed sequence}
if [[ " $parts " == *" embed "* ]]; then
    for batch in 256 32; do
        PRECOMPUTE_ENGINE_BATCH_SIZE=$batch python3 -m precompute bench embed --model "$repo/.gpu/model" \
            --corpus "$repo/data/demo/corpus.parquet" --docs 5000 --repeats 7 | tee "$out/embed-batch$batch.log"
    done
fi
if [[ " $parts " == *" sequence "* ]]; then
    python3 -m precompute.bench.recs.sequence_device 3 | tee "$out/sequence.log"
fi
