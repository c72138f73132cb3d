#!/usr/bin/env bash
# Issue 33's H200 runs, one device call each (the call's limit is 600 s):
#   benchmarks/gpu_train_suite.sh 1   GPU training tests, 8B LoRA and QLoRA on instruct-like lengths, 8B LoRA on documents
#   benchmarks/gpu_train_suite.sh 2   0.6B on chat and document lengths, 8B on chat lengths, 8B LoRA on a 46 GiB card
#   benchmarks/gpu_train_suite.sh 3   the adapter_cast A/B (8B LoRA instruct: plain, cudaload, cudaload with PEFT's
#                                     cast put back; twice, the order reversed), the 46 GiB card again, 0.6B QLoRA
#   benchmarks/gpu_train_suite.sh 4   issue 44: cudaload_varlen's GPU tests, then 8B LoRA on chat lengths with
#                                     torch's varlen kernels, packed sdpa and padded sdpa on the same data
#   benchmarks/gpu_train_suite.sh 5   issue 44 (not yet run): compiled layers against the plain recipes where the
#                                     2026-12-07 H100 runs left gaps: 8B LoRA on document lengths, 8B QLoRA on
#                                     instruction-like lengths (carry the quant wheels)
#   benchmarks/gpu_train_suite.sh 6   issue 44 item 4 (not yet run): the plan's longest sequence at emulated card
#                                     sizes (QLoRA 8B at 24/16/12 GiB, LoRA 8B at 24, full 0.6B at 12/8) trained at
#                                     that length: out of memory or not, predicted against measured peaks
#                                     (benchmarks/bench_fit_boundary.py; carry the quant wheels)
#   benchmarks/gpu_train_suite.sh 7   issue 44 item 5 (not yet run): TRL's SFTTrainer on SFTConfig(**sft_config_arguments
#                                     (plan)) against cudaload's Trainer path, 8B LoRA on chat lengths, the same data:
#                                     tokens/s, peaks, sequences a step; each also with compiled layers (carry the TRL
#                                     pack: benchmarks/pack_trl_site.sh, trl 1.16.0 + datasets 5.2.0 + pyarrow ...)
#   benchmarks/gpu_train_suite.sh 8   issue 44 item 3 (not yet run): QLoRA's compiled step against LoRA's, profiled
#                                     (train_step_profile.py; carry the quant wheels)
# Needs .whl/ from benchmarks/pack_device_site.sh (flash-attn-4, bitsandbytes, liger-kernel) carried; results under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
source .whl/env.sh || exit 1
out=${OUT:-/tmp/out}
mkdir -p "$out"
log() { grep --line-buffered -v -e Warning -e warn; }
case ${1:-1} in
  1)
    timeout 170 python -m pytest -q -p no:cacheprovider tests/test_training_gpu.py 2>&1 | tail -60 > "$out/gputests.log"
    timeout 390 python benchmarks/bench_train.py --out "$out/t1" --shapes 8b --modes lora,qlora \
      --dists instruct --budget-s 250 2>&1 | log > "$out/bench1.log"
    timeout 150 python benchmarks/bench_train.py --out "$out/t2" --shapes 8b --modes lora --dists docs \
      --budget-s 140 2>&1 | log > "$out/bench2.log"
    ;;
  2)
    timeout 200 python benchmarks/bench_train.py --out "$out/t3" --shapes 0.6b --modes lora,qlora \
      --dists chat,docs --budget-s 190 2>&1 | log > "$out/bench3.log"
    timeout 200 python benchmarks/bench_train.py --out "$out/t4" --shapes 8b --modes qlora,lora --dists chat \
      --budget-s 190 2>&1 | log > "$out/bench4.log"
    timeout 110 python benchmarks/bench_train.py --out "$out/t5" --shapes 8b --modes lora --dists instruct \
      --methods cudaload --card-gib 46 --budget-s 100 2>&1 | log > "$out/bench5.log"
    ;;
  3)
    timeout 215 python benchmarks/bench_train.py --out "$out/t1" --shapes 8b --modes lora --dists instruct \
      --methods plain,cudaload,cudaload-peftcast --budget-s 205 2>&1 | log > "$out/bench1.log"
    timeout 190 python benchmarks/bench_train.py --out "$out/t2" --shapes 8b --modes lora --dists instruct \
      --methods cudaload-peftcast,cudaload,plain --budget-s 180 2>&1 | log > "$out/bench2.log"
    timeout 70 python benchmarks/bench_train.py --out "$out/t3" --shapes 8b --modes lora --dists instruct \
      --methods cudaload --card-gib 46 --budget-s 65 2>&1 | log > "$out/bench3.log"
    timeout 90 python benchmarks/bench_train.py --out "$out/t4" --shapes 0.6b --modes qlora --dists chat \
      --budget-s 85 2>&1 | log > "$out/bench4.log"
    ;;
  4)
    timeout 200 python -m pytest -q -p no:cacheprovider tests/test_torch_varlen_gpu.py tests/test_torch_varlen.py \
      2>&1 | tail -60 > "$out/varlen_tests.log"
    timeout 380 python benchmarks/bench_train.py --out "$out/t1" --shapes 8b --modes lora --dists chat \
      --methods cudaload-varlen,cudaload-sdpa-packed,cudaload-sdpa-padded --budget-s 370 2>&1 | log > "$out/bench1.log"
    cp "$out/t1/results.md" "$out/varlen_results.md" 2>/dev/null  # its "Attention and layout" table
    ;;
  6)
    timeout 580 python benchmarks/bench_fit_boundary.py --out "$out/fit" --work /tmp/cudaload-bench --budget-s 540 \
      2>&1 | log > "$out/fit.log"
    ;;
  5)
    timeout 300 python benchmarks/bench_train.py --out "$out/t1" --shapes 8b --modes lora --dists docs \
      --methods cudaload-compiled,plain,cudaload --budget-s 290 2>&1 | log > "$out/bench1.log"
    timeout 260 python benchmarks/bench_train.py --out "$out/t2" --shapes 8b --modes qlora --dists instruct \
      --methods cudaload-compiled,plain --budget-s 250 2>&1 | log > "$out/bench2.log"
    ;;
  7)
    timeout 575 python benchmarks/bench_train.py --out "$out/t1" --shapes 8b --modes lora --dists chat \
      --methods cudaload,cudaload-trl,cudaload-trl-compiled,cudaload-compiled --budget-s 560 2>&1 | log > "$out/bench1.log"
    ;;
  8)
    # where QLoRA's compiled step loses to LoRA's (0.338 against 0.248 s a step on the H100): both profiled
    # compiled on the same short packed data, QLoRA eager beside them (dequantization, casts, graph breaks)
    p=benchmarks/investigations/train_step_profile.py
    timeout 110 python $p --shape 8b --intent qlora --out "$out/qlora_eager.json" > "$out/qlora_eager.log" 2>&1
    timeout 210 python $p --shape 8b --intent qlora --compile-layers --warmup 6 --steps 4 \
      --out "$out/qlora_compiled.json" > "$out/qlora_compiled.log" 2>&1
    timeout 200 python $p --shape 8b --intent lora --compile-layers --warmup 6 --steps 4 \
      --out "$out/lora_compiled.json" > "$out/lora_compiled.log" 2>&1
    for f in "$out"/*.log; do tail -c 3000 "$f" > "$f.tail"; rm -f "$f"; done
    ;;
esac
rm -f "$out"/*/results.md
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
python -c "import torch, transformers, peft; print(torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__)" >> "$out/gpu.txt" 2>&1
