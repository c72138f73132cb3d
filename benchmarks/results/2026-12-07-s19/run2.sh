#!/usr/bin/env bash
# One device call (at most 590 s; carry .whl from ../shared/device/wheels.sh quant). It branches on the card lent:
#   H200: issue 44's H200 run (../2026-12-07-h200/run_train.sh: compiled layers against the plain recipes, 8B LoRA
#         and QLoRA on chat lengths, then LoRA on document lengths)
#   other (H100): issue 44 item 4's remaining boundaries (QLoRA Llama-3.1-8B at 16 GiB, full Qwen3-0.6B at 8 GiB,
#         trained at the plan's longest sequence), then the chunked loss against transformers' on chat data with
#         half of each example a masked prompt (bench_train.py --prompt-frac 0.5)
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../../.."
if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
  exec bash benchmarks/results/2026-12-07-h200/run_train.sh
fi
source .whl/env.sh || exit 1
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}; mkdir -p "$out"
log() { grep --line-buffered -v -e Warning -e warn; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python -c "import sys, torch, transformers, peft, bitsandbytes; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, bitsandbytes.__version__)"; } > "$out/gpu.txt" 2>&1
timeout 300 python benchmarks/bench_fit_boundary.py --out "$out/fit" --work /tmp/cudaload-bench --budget-s 290 \
  --cases qlora:llama8b:16 2>&1 | log > "$out/fit.log"
echo "fit $(date -u +%T)" >> "$out/gpu.txt"
left=$(( 585 - SECONDS ))
[ $left -gt 90 ] && timeout $left python benchmarks/bench_train.py --out "$out/t1" --work /tmp/cudaload-bench \
  --shapes 8b --modes lora --dists chat --prompt-frac 0.5 --methods cudaload-chunked,cudaload \
  --budget-s $((left - 5)) 2>&1 | log > "$out/bench1.log"
echo "chunked $(date -u +%T)" >> "$out/gpu.txt"
rm -f "$out"/*/results.md
exit 0
