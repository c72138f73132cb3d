#!/usr/bin/env bash
# Issue 44 item 4 (one device call, at most 390 s; carry .whl from ../shared/device/wheels.sh quant): the plan's
# longest sequence at emulated card sizes, trained at that length (benchmarks/bench_fit_boundary.py's default
# cases), after the chunked loss's GPU test. The plans at these boundaries take cudaload's chunked loss (no
# liger-kernel carried). Every card is emulated (set_per_process_memory_fraction), so an H100 serves as well as the H200.
set -uo pipefail
cd "$(dirname "$0")/../../../.."
source .whl/env.sh || exit 1
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}; mkdir -p "$out"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; \
  python -c "import sys, torch, transformers, peft, bitsandbytes; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, bitsandbytes.__version__)"; \
  git log -1 --format='%H %s' | cut -c1-120; } > "$out/gpu.txt" 2>&1
timeout 45 python -m pytest -q -p no:cacheprovider -m gpu tests/test_chunked_loss.py > "$out/pytest.log" 2>&1
echo "pytest rc=$? $(date -u +%T)" >> "$out/pytest.log"
timeout 330 python benchmarks/bench_fit_boundary.py --out "$out/fit" --work /tmp/cudaload-bench --budget-s 320 \
  --cases qlora:llama8b:24,qlora:llama8b:12,full:qwen0.6b:12,lora:llama8b:24 \
  2>&1 | grep --line-buffered -v -e Warning -e warn > "$out/fit.log"
echo "done $(date -u +%T)" >> "$out/gpu.txt"
exit 0
