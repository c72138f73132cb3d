#!/usr/bin/env bash
# Issues 44 and 43 on the H200 in one device call (at most 595 s; carry .whl from ../shared/device/wheels.sh quant),
# for a session that could expect one call only. Fresh processes, the 8B shape with random bf16 weights:
#   1. bench_train.py LoRA chat: cudaload (compiled layers, training-only dispatcher) against the plain recipe
#   2. bench_train.py QLoRA chat: cudaload (compiled layers) against PEFT's QLoRA recipe
#   3. bench_decode.py from process start: cudaload!:mix (nothing declared: 640+64, 640+3,000, 640+64, empty caches)
#      then declared!:long3k (the 640+3,000 call declared, empty caches), with the time left
set -uo pipefail
cd "$(dirname "$0")/../../../.."  # the repository root (it ran as benchmarks/results/2026-12-07-h200/run_both.sh)
source .whl/env.sh || exit 1
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1
out=${OUT:-/tmp/out}; W=/tmp/cudaload-bench; mkdir -p "$out"
log() { grep --line-buffered -v -e Warning -e warn; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python -c "import sys, torch, transformers, peft, bitsandbytes; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, bitsandbytes.__version__)"; \
  git log -1 --format='%H %s' | cut -c1-120; } > "$out/gpu.txt" 2>&1
echo "start $(date -u +%T) ${SECONDS}s" >> "$out/gpu.txt"
timeout 165 python benchmarks/bench_train.py --out "$out/t1" --work $W --shapes 8b --modes lora --dists chat \
  --methods cudaload-compiled,plain --budget-s 160 2>&1 | log > "$out/bench1.log"
echo "lora chat $(date -u +%T) ${SECONDS}s" >> "$out/gpu.txt"
timeout 170 python benchmarks/bench_train.py --out "$out/t2" --work $W --shapes 8b --modes qlora --dists chat \
  --methods cudaload-compiled,plain --budget-s 165 2>&1 | log > "$out/bench2.log"
echo "qlora chat $(date -u +%T) ${SECONDS}s" >> "$out/gpu.txt"
left=$(( 588 - SECONDS ))
[ $left -gt 60 ] && timeout $left python benchmarks/bench_decode.py --out "$out/d9" --work $W \
  --runs "cudaload!:mix,declared!:long3k" --budget-s $((left-4)) > "$out/d9.log" 2>&1
echo "decode $(date -u +%T) ${SECONDS}s" >> "$out/gpu.txt"
rm -f "$out"/*/results.md
exit 0
