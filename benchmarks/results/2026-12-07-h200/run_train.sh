#!/usr/bin/env bash
# Issue 44's H200 run (one device call, at most 590 s; carry .whl from ../shared/device/wheels.sh quant):
#   1. the GPU test of compiled layers (training-only dispatcher: compiled against eager, 3 optimizer steps)
#   2. bench_train.py, 8B shape (random bf16 weights), fresh processes, real tokens a second over the timed steps:
#      LoRA chat: cudaload with batch_size left out (steps filled to the token bound, what the README's example
#        does), with batch_size=8 declared, and the plain recipe (padded, checkpointing), all in one run
#      QLoRA chat: cudaload filled against PEFT's QLoRA recipe
#      LoRA docs: cudaload filled against the plain recipe (last: the budget may cut it)
set -uo pipefail
cd "$(dirname "$0")/../../.."
source .whl/env.sh || exit 1
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}; W=/tmp/cudaload-bench; mkdir -p "$out"
log() { grep --line-buffered -v -e Warning -e warn; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python -c "import sys, torch, transformers, peft, bitsandbytes; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, bitsandbytes.__version__)"; \
  git log -1 --format='%H %s' | cut -c1-120; } > "$out/gpu.txt" 2>&1
echo "start $(date -u +%T)" >> "$out/gpu.txt"
timeout 60 python -m pytest -q -p no:cacheprovider -m gpu tests/test_layer_compile.py 2>&1 | tail -30 > "$out/pytest.log"
echo "tests $(date -u +%T)" >> "$out/gpu.txt"
timeout 230 python benchmarks/bench_train.py --out "$out/t1" --work $W --shapes 8b --modes lora --dists chat \
  --methods cudaload-fill-compiled,cudaload-compiled,plain --budget-s 225 2>&1 | log > "$out/bench1.log"
echo "lora chat $(date -u +%T)" >> "$out/gpu.txt"
timeout 170 python benchmarks/bench_train.py --out "$out/t2" --work $W --shapes 8b --modes qlora --dists chat \
  --methods cudaload-fill-compiled,plain --budget-s 165 2>&1 | log > "$out/bench2.log"
echo "qlora chat $(date -u +%T)" >> "$out/gpu.txt"
left=$(( 585 - SECONDS )); [ $left -gt 60 ] && timeout $left python benchmarks/bench_train.py --out "$out/t3" --work $W \
  --shapes 8b --modes lora --dists docs --methods cudaload-fill-compiled,plain --budget-s $((left-5)) 2>&1 | log > "$out/bench3.log"
echo "lora docs $(date -u +%T)" >> "$out/gpu.txt"
rm -f "$out"/*/results.md
exit 0
