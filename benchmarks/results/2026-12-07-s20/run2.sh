#!/usr/bin/env bash
# The second device call (at most 590 s; carry .whl: the TRL pack from benchmarks/pack_trl_site.sh). It branches
# on the card lent:
#   H200: issue 43's H200 run (../2026-12-07-h200/run.sh: the per-call decode's GPU test, then the 8B shape's
#         undeclared and declared generate() from process start, cold and warm)
#   other: issue 44 item 5 (benchmarks/gpu_train_suite.sh 7): TRL's SFTTrainer on sft_config_arguments(plan)
#         against cudaload's Trainer path, 8B LoRA on chat lengths, each eager and with compiled layers
set -uo pipefail
cd "$(dirname "$0")/../../.."
out=${OUT:-/tmp/out}; mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/card.txt" 2>&1
if grep -q H200 "$out/card.txt"; then
  exec bash benchmarks/results/2026-12-07-h200/run.sh
fi
exec bash benchmarks/gpu_train_suite.sh 7
