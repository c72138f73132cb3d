#!/usr/bin/env bash
# The chunked loss's speed (one device call, at most 210 s; nothing carried): bench_train.py, Qwen3-8B shape LoRA
# on chat lengths, the plan (transformers' loss: memory is not short) against the same plan with
# loss="cudaload_chunked", eager layers, fresh processes.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
export PYTHONPATH=$PWD/src:$PWD/benchmarks PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
out=${OUT:-/tmp/out}; mkdir -p "$out"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python -c "import sys, torch, transformers, peft; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__)"; } > "$out/gpu.txt" 2>&1
timeout 200 python benchmarks/bench_train.py --out "$out/t1" --work /tmp/cudaload-bench --shapes 8b --modes lora \
  --dists chat --methods cudaload-chunked,cudaload --budget-s 195 2>&1 | grep --line-buffered -v -e Warning -e warn > "$out/bench1.log"
rm -f "$out"/*/results.md
exit 0
