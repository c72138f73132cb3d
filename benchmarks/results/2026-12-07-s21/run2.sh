#!/usr/bin/env bash
# Session 21's second device call (at most 590 s, nothing carried): issue 43 item 3, fused projections in the
# compiled decode step (benchmarks/investigations/decode_compile_options.py: base against fused, each in a fresh
# process, 8B shape, batch 1, 512+256 calls), then item 4 / 6: batch 4 compiled and the notebook's calls with
# nothing declared (bench_decode.py, fresh processes).
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}; work=/tmp/cudaload-bench; mkdir -p "$out" "$work"
log() { grep --line-buffered -v -e Warning -e warn; }
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__)"; \
  git log -1 --format='%H %s' | cut -c1-120; } > "$out/gpu.txt" 2>&1
timeout 300 python benchmarks/investigations/decode_compile_options.py --variants base,fused \
  --timeout-s 150 --budget-s 295 > "$out/options.jsonl" 2> "$out/options.err"
echo "options $(date -u +%T)" >> "$out/gpu.txt"
left=$(( 585 - SECONDS ))
[ $left -gt 90 ] && timeout $left python benchmarks/bench_decode.py --out "$out/d10" --work "$work" \
  --runs "compiled:b4,cudaload:notebook" --budget-s $((left - 5)) 2>&1 | log > "$out/d10.log"
echo "done $(date -u +%T)" >> "$out/gpu.txt"
rm -f "$out"/d*/results.md
exit 0
