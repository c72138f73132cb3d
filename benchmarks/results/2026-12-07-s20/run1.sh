#!/usr/bin/env bash
# Issue 44 item 4 (one device call, at most 590 s; carry .whl: the quant wheels or the TRL pack, which holds bitsandbytes): every
# default fit-boundary case with the chunked loss's measured allocator slack (CHUNKED_SLACK_PER_LOGIT = 1.0,
# where 2.25 was planned): the plan's longest sequence on each emulated card, trained at exactly that length.
# The boundaries move out (H100 profile: qlora 8B 24 GiB 23,296 -> 28,672; 12 GiB 7,680 -> 9,728; 16 GiB
# 12,800 -> 15,872; lora 8B 24 GiB 11,008 -> 13,568; full 0.6B 12 GiB 23,296 -> 39,936; 8 GiB 13,056 -> 23,808);
# none may run out of memory. Every card is emulated (set_per_process_memory_fraction): any card serves.
set -uo pipefail
cd "$(dirname "$0")/../../.."
source .whl/env.sh || exit 1
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}; mkdir -p "$out"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python -c "import sys, torch, transformers, peft, bitsandbytes; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, bitsandbytes.__version__)"; } > "$out/gpu.txt" 2>&1
timeout 575 python benchmarks/bench_fit_boundary.py --out "$out/fit" --work /tmp/cudaload-bench --budget-s 565 \
  --cases full:qwen0.6b:8,qlora:llama8b:24,lora:llama8b:24,qlora:llama8b:12,full:qwen0.6b:12,qlora:llama8b:16 \
  2>&1 | grep --line-buffered -v -e Warning -e warn > "$out/fit.log"
echo "done $(date -u +%T)" >> "$out/gpu.txt"
rm -f "$out"/fit/results.md
exit 0
