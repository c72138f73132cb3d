#!/usr/bin/env bash
# One device call (at most 590 s; carry .whl from ../shared/device/wheels.sh quant):
#   1. issue 43 item 3: the compiled decode step with inductor's options (decode_compile_options.py: cudaload's
#      plan, coordinate descent tuning (gpt-fast's setting: M=1 matmuls become tuned Triton reductions), and that
#      with fused q/k/v and gate/up projections), Qwen3-8B shape, batch 1, fresh processes
#   2. issue 44 item 4: the two boundaries not yet run (QLoRA Llama-3.1-8B on 16 GiB, full Qwen3-0.6B on 8 GiB),
#      trained at the plan's longest sequence
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
cd "$here/../../.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; } > "$out/gpu.txt" 2>&1
PYTHONPATH=$PWD/src HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 timeout 410 python \
  benchmarks/investigations/decode_compile_options.py --variants base,cdt,fused_cdt --timeout-s 170 --budget-s 400 \
  > "$out/options.jsonl" 2> "$out/options.err"
echo "options $(date -u +%T)" >> "$out/gpu.txt"
source .whl/env.sh || exit 1
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site
python -c "import sys, torch, transformers, peft, bitsandbytes; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, bitsandbytes.__version__)" >> "$out/gpu.txt" 2>&1
left=$(( 585 - SECONDS ))
[ $left -gt 60 ] && timeout $left python benchmarks/bench_fit_boundary.py --out "$out/fit" --work /tmp/cudaload-bench \
  --budget-s $((left - 5)) --cases full:qwen0.6b:8,qlora:llama8b:16 2>&1 | grep --line-buffered -v -e Warning -e warn > "$out/fit.log"
echo "fit $(date -u +%T)" >> "$out/gpu.txt"
rm -f "$out"/fit/results.md
exit 0
