#!/usr/bin/env bash
# Not yet run. Issue 44 items 1 and 5 (one device call, at most 590 s; carry .whl: the quant wheels or the TRL
# pack): the Trainer path with its packed steps filled to the plan's token bound (batch_size not declared:
# cudaload-fill) against the same with batch_size=8 declared and the plain recipe, 8B LoRA then QLoRA on chat
# lengths, compiled layers (bench_train.py; the TRL rows of gpu2 / gpu4 are the reference for full rows).
set -uo pipefail
cd "$(dirname "$0")/../../.."
source .whl/env.sh || exit 1
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}; mkdir -p "$out"
log() { grep --line-buffered -v -e Warning -e warn; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python -c "import sys, torch, transformers, peft; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__)"; } > "$out/gpu.txt" 2>&1
timeout 400 python benchmarks/bench_train.py --out "$out/t1" --work /tmp/cudaload-bench --shapes 8b --modes lora \
  --dists chat --methods cudaload-fill-compiled,cudaload-compiled,plain --budget-s 390 2>&1 | log > "$out/bench1.log"
left=$(( 580 - SECONDS ))
[ $left -gt 120 ] && timeout $left python benchmarks/bench_train.py --out "$out/t2" --work /tmp/cudaload-bench \
  --shapes 8b --modes qlora --dists chat --methods cudaload-fill-compiled --budget-s $((left - 5)) 2>&1 | log > "$out/bench2.log"
echo "done $(date -u +%T)" >> "$out/gpu.txt"
rm -f "$out"/*/results.md
exit 0
