#!/usr/bin/env bash
# GPU run 1 (2026-12-07): decode_graphs.py on the 8B shape, then train_step_profile.py (short packed LoRA).
set -uo pipefail
cd out/head
export PYTHONPATH=$PWD/src:$PWD/benchmarks HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
o=${OUT:-/tmp/out}; mkdir -p "$o"
{ date -u; nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv; python -c "import sys, torch, transformers; print(sys.version.split()[0], torch.__version__, torch.version.cuda, transformers.__version__)"; python -c "import torch.nn.attention.varlen as v, inspect; print('varlen', inspect.signature(v.varlen_attn))" ; } > "$o/gpu.txt" 2>&1
timeout 60 python -m pytest -q -s -p no:cacheprovider -m gpu tests/test_graphed_decode.py > "$o/pytest.log" 2>&1; echo "pytest rc=$?" >> "$o/pytest.log"
timeout 300 python benchmarks/investigations/decode_graphs.py --shape 8b --parts dyn,graph,prod,cgb --out "$o/graphs.jsonl" --work /tmp/cb > "$o/graphs.log" 2>&1
echo "graphs rc=$? $(date -u +%T)" >> "$o/graphs.log"
timeout 190 python benchmarks/investigations/train_step_profile.py --shape 8b --out "$o/train_profile.json" --work /tmp/cb > "$o/train.log" 2>&1
echo "train rc=$? $(date -u +%T)" >> "$o/train.log"
exit 0
