#!/usr/bin/env bash
# Session 22's first device call: on an H200, issue 43's run (2026-12-07-h200/run.sh); on any other card, issue
# 44's two missing same-run comparisons (2026-12-08-s22/run_train.sh: QLoRA filled against QLoRA plain, documents
# filled against plain). Carry .whl (benchmarks/pack_trl_site.sh); LIMIT: the seconds left.
set -uo pipefail
cd "$(dirname "$0")/../../.."
name=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)
echo "card: $name"
case "$name" in
  *H200*) exec bash benchmarks/results/2026-12-07-h200/run.sh ;;
  *) exec bash benchmarks/results/2026-12-08-s22/run_train.sh ;;
esac
