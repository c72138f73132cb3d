#!/usr/bin/env bash
# GPU run 2 (2026-12-07): the graphed decode's GPU test; its figures measured on this GPU and put into the
# snapshot's priors (decode_graphs.py --record); then generate() from process start (bench_decode.py).
set -uo pipefail
cd out/head
export PYTHONPATH=$PWD/src:$PWD/benchmarks HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__)"; } > "$o/gpu.txt" 2>&1
timeout 60 python -m pytest -q -s -p no:cacheprovider -m gpu tests/test_graphed_decode.py tests/test_torch_varlen_gpu.py > "$o/pytest.log" 2>&1; echo "pytest rc=$?" >> "$o/pytest.log"
timeout 125 python benchmarks/investigations/decode_graphs.py --shape 8b --parts prod --record src/cudaload/tuning/priors.json --out "$o/graphs.jsonl" --work /tmp/cb > "$o/graphs.log" 2>&1
echo "graphs rc=$? $(date -u +%T)" >> "$o/graphs.log"
cp src/cudaload/tuning/priors.json "$o/priors.json"
true

exit 0
