#!/usr/bin/env bash
# Issue 44 on a card other than the H200, in what a late start leaves of the budget (LIMIT seconds, default 540;
# carry .whl from benchmarks/pack_trl_site.sh). The two comparisons 2026-12-07-s21 could not fit:
#   QLoRA chat: cudaload with batch_size left out (filled steps) against PEFT's QLoRA recipe, in one run
#   LoRA docs:  cudaload filled against the plain recipe (padded, checkpointing), in one run (last: LIMIT may cut it)
set -uo pipefail
cd "$(dirname "$0")/../../.."
source .whl/env.sh || exit 1
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}; W=/tmp/cudaload-bench; mkdir -p "$out"; limit=${LIMIT:-540}
log() { grep --line-buffered -v -e Warning -e warn; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python -c "import sys, torch, transformers, peft, bitsandbytes; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, bitsandbytes.__version__)"; \
  git log -1 --format='%H %s' | cut -c1-120; } > "$out/gpu.txt" 2>&1
echo "start $(date -u +%T)" >> "$out/gpu.txt"
left=$(( limit / 2 - SECONDS ))
timeout $left python benchmarks/bench_train.py --out "$out/t1" --work $W --shapes 8b --modes qlora --dists chat \
  --methods cudaload-fill-compiled,plain --budget-s $((left - 5)) 2>&1 | log > "$out/bench1.log"
echo "qlora chat $(date -u +%T)" >> "$out/gpu.txt"
left=$(( limit - 5 - SECONDS )); [ $left -gt 90 ] && timeout $left python benchmarks/bench_train.py --out "$out/t2" \
  --work $W --shapes 8b --modes lora --dists docs --methods cudaload-fill-compiled,plain --budget-s $((left - 5)) \
  2>&1 | log > "$out/bench2.log"
echo "lora docs $(date -u +%T)" >> "$out/gpu.txt"
rm -f "$out"/*/results.md
exit 0
