#!/usr/bin/env bash
# Issue 43's H200 run (one device call, at most 480 s): generate() deciding its decode per call.
#   1. the GPU test of the per-call path on the small model (nothing faked: a short call on transformers' path, a
#      long call compiled with the dynamic path's greedy tokens, a second long call with no compile)
#   2. the 8B shape (random bf16 weights), fresh processes, from process start (bench_decode.py):
#      dynamic:short64   load_model(path, decode="dynamic"): two 640+64 calls, the undeclared default before
#      cudaload:mix      load_model(path), nothing declared, empty caches: 640+64, 640+3,000, 640+64 (cold)
#      cudaload~:mix     the same, a fresh inductor folder, cudaload's artifacts from the run before (warm)
#      declared~:long3k  load_model(path, seq_len=3640, batch_size=1, new_tokens=3000): 640+3,000, warm
#      declared!:long3k  the same with empty caches (cold; last: the budget may end it)
# Outputs under $OUT, written to files directly.
set -uo pipefail
cd "$(dirname "$0")/../../.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
work=/tmp/cudaload-bench-43  # its own caches: a machine held before may have /tmp/cudaload-bench's warm
mkdir -p "$out" "$work"
if [ -f /tmp/cudaload-bench/Qwen3-8B/config.json ] && [ ! -e "$work/Qwen3-8B" ]; then
  ln -s /tmp/cudaload-bench/Qwen3-8B "$work/Qwen3-8B"  # the same random weights: no need to write them again
fi
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__)"; \
  git log -1 --format='%H %s' | cut -c1-120; } > "$out/gpu.txt" 2>&1
timeout 100 python -m pytest -q -s -p no:cacheprovider -m gpu tests/test_decode_per_call.py > "$out/pytest.log" 2>&1
echo "pytest rc=$? $(date -u +%T)" >> "$out/pytest.log"
timeout 355 python benchmarks/bench_decode.py --out "$out/d9" --work "$work" \
  --runs "dynamic:short64,cudaload:mix,cudaload~:mix,declared~:long3k,declared!:long3k" --budget-s 350 \
  > "$out/d9.log" 2>&1
echo "bench rc=$? $(date -u +%T)" >> "$out/d9.log"
exit 0
