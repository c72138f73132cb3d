#!/usr/bin/env bash
# Issue 35's H200 run, one device call (limit 600 s): the 8B shape, fresh processes.
#   1. load_model() defaults (dynamic decode): ms per token at 512-1,500-token prompts (the probe job)
#   2. cudaload precompile --decode for the long job's plan (512 + 5,000 at batch 1): the cold compile, artifacts
#      saved under CUDALOAD_CACHE
#   3. the long job with the work declared, in a process with an empty inductor cache (only cudaload's artifacts),
#      then again with this machine's inductor cache too (profiled: where the decode step's time goes)
# Results under $OUT. Needs nothing carried (no flash-attn, no bitsandbytes).
#   benchmarks/gpu_decode_suite.sh 2   the next run (not yet run): each SDPA backend on one decode step over a
#      static cache (benchmarks/investigations/decode_attention_kernels.py), then the declared job profiled
#   benchmarks/gpu_decode_suite.sh 3   the compiled step with the grouped decode attention: probe profiled, the
#      long job compiled cold then warm, the default on the long job, the short job default and declared
#   benchmarks/gpu_decode_suite.sh 4   GPU parity tests, then short / probe / batched jobs (see the branch)
#   benchmarks/gpu_decode_suite.sh 5   the late stop (cudaload.execute.runtime.decode_loop): GPU parity tests, then both decode
#      loops on the probe's calls in one process, compiled (profiled) and dynamic (the ab job)
#   benchmarks/gpu_decode_suite.sh 7   (carry .whl with the quant group) the quantized rungs' decode and plain
#      transformers on the long job
#   benchmarks/gpu_decode_suite.sh 6   the long job compiled with the late stop, cold then warm, then the ab job
#      again (where the two loops' greedy ids part)
#   benchmarks/gpu_decode_suite.sh 8   issue 43's goals (not yet run): this GPU's graphed decode measured and
#      written into the priors (decode_graphs.py --record), then from process start: one undeclared 640+3,000
#      call (graphed), the same declared cold and warm (compiled), and short calls undeclared against dynamic
#   benchmarks/gpu_decode_suite.sh 9   issue 43 item 4 (not yet run): batched decode, batch 8 compiled / graphed
#      (undeclared) / plain, then batch 32 compiled, 2 calls of +256 each
#   benchmarks/gpu_decode_suite.sh 10  issue 43 item 6 (not yet run): a notebook's calls (640+20, +120, 700+300,
#      then 640+3,000) undeclared, plain and declared; then batch 4 compiled
#   benchmarks/gpu_decode_suite.sh 11  issue 43 item 3 (not yet run): the compiled step with gpt-fast's coordinate
#      descent tuning and with fused projections (benchmarks/investigations/decode_compile_options.py)
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/src${PYTHONPATH:+:$PYTHONPATH} HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
out=${OUT:-/tmp/out}
work=/tmp/cudaload-bench
mkdir -p "$out" "$work"
log() { grep --line-buffered -v -e Warning -e warn; }
if [ "${1:-1}" = 11 ]; then
  timeout 585 python benchmarks/investigations/decode_compile_options.py --variants base,cdt,fused_cdt,fused,fused_mat \
    --timeout-s 170 --budget-s 575 > "$out/options.jsonl" 2> "$out/options.err"
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
  exit 0
fi
if [ "${1:-1}" = 9 ] || [ "${1:-1}" = 10 ]; then
  if [ "$1" = 9 ]; then runs="compiled:b8,cudaload:b8,plain:b8,compiled:b32"; else
    runs="cudaload:notebook,plain:notebook,declared:notebook,compiled:b4"; fi
  timeout 580 python benchmarks/bench_decode.py --out "$out/d$1" --work "$work" --runs "$runs" --budget-s 575 \
    2>&1 | log > "$out/d$1.log"
  rm -f "$out"/d*/results.md
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
  exit 0
fi
if [ "${1:-1}" = 8 ]; then
  timeout 150 python benchmarks/investigations/decode_graphs.py --shape 8b --parts dyn,prod \
    --record src/cudaload/tuning/priors.json --out "$out/graphs.jsonl" --work "$work" 2>&1 | log > "$out/graphs.log"
  cp src/cudaload/tuning/priors.json "$out/priors.json"
  timeout 420 python benchmarks/bench_decode.py --out "$out/d9" --work "$work" \
    --runs "cudaload:long3k,declared!:long3k,declared~:long3k,dynamic:short64,cudaload:short64" --budget-s 415 \
    2>&1 | log > "$out/d9.log"
  rm -f "$out"/d*/results.md
  exit 0
fi
if [ "${1:-1}" = 7 ]; then
  # carry .whl (../shared/device/wheels.sh quant): the quantized rungs' decode, then plain transformers on the
  # long job (last: the budget may end it)
  source .whl/env.sh
  timeout 570 python benchmarks/bench_decode.py --out "$out/d8" --work "$work" \
    --runs "cudaload:quant,cudaload:nf4:quant,cudaload:int8:quant,plain:long" --budget-s 565 2>&1 | log > "$out/d8.log"
  rm -f "$out"/d*/results.md
  exit 0
fi
if [ "${1:-1}" = 6 ]; then
  timeout 560 python benchmarks/bench_decode.py --out "$out/d7" --work "$work" \
    --runs "compiled:long,compiled~:long,compiled:ab" --reps 2 --budget-s 555 2>&1 | log > "$out/d7.log"
  rm -f "$out"/d*/results.md
  exit 0
fi
if [ "${1:-1}" = 5 ]; then
  timeout 150 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_loop.py tests/test_decode_exec.py \
    -k "late_loop or matches_the_dynamic or gpu_static or inside_the_bucket" > "$out/pytest.log" 2>&1
  echo "pytest rc=$? $(date +%T)" >> "$out/pytest.log"
  timeout 400 python benchmarks/bench_decode.py --out "$out/d6" --work "$work" --runs "compiled:ab,cudaload:ab" \
    --reps 3 --profile 0:compiled:ab --budget-s 395 2>&1 | log > "$out/d6.log"
  rm -f "$out"/d*/results.md
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
  python -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)" >> "$out/gpu.txt" 2>&1
  exit 0
fi
if [ "${1:-1}" = 4 ]; then
  # the GPU parity tests (compiled vs dynamic greedy tokens on sdpa and on cudaload_sdpa's grouped attention, the
  # sdpa variants' bf16 logits), then: the short job after the padded/unpadded decode cuDNN thresholds, the probe
  # compiled cold and warm and dynamic (more samples, another order), the short and batched jobs plain and default,
  # the batched job compiled
  timeout 170 python -m pytest -q -p no:cacheprovider -m gpu tests/test_decode_exec.py tests/test_sdpa_decode.py \
    -k "matches_the_dynamic or gpu_logits or gpu_dispatch or gpu_static" > "$out/pytest.log" 2>&1
  echo "pytest rc=$? $(date +%T)" >> "$out/pytest.log"
  timeout 400 python benchmarks/bench_decode.py --out "$out/d5" --work "$work" \
    --runs "cudaload:short,compiled:probe,compiled~:probe,cudaload:probe,plain:short,cudaload:batched,plain:batched,compiled:batched" \
    --budget-s 395 2>&1 | log > "$out/d5.log"
  rm -f "$out"/d*/results.md
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
  exit 0
fi
if [ "${1:-1}" = 3 ]; then
  # after the grouped decode attention: the compiled step profiled, the long job compiled cold and warm (a
  # fresh inductor folder: cudaload's artifacts only), today's default on the same job, the short job both ways
  timeout 585 python benchmarks/bench_decode.py --out "$out/d4" --work "$work" \
    --runs "compiled:probe,compiled:long,compiled~:long,cudaload:long,cudaload:short,declared:short" \
    --profile 0:compiled:probe --budget-s 580 2>&1 | log > "$out/d4.log"
  rm -f "$out"/d*/results.md
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
  exit 0
fi
if [ "${1:-1}" = 2 ]; then
  timeout 90 python benchmarks/investigations/decode_attention_kernels.py > "$out/kernels.jsonl" 2> "$out/kernels.err"
  timeout 400 python benchmarks/bench_decode.py --out "$out/d3" --work "$work" \
    --runs "compiled:probe" --profile 0:compiled:probe --budget-s 390 2>&1 | log > "$out/d3.log"
  rm -f "$out"/d*/results.md
  exit 0
fi
timeout 100 python benchmarks/bench_decode.py --out "$out/d1" --work "$work" --runs cudaload:probe --budget-s 92 2>&1 \
  | log > "$out/d1.log"
CUDALOAD_CACHE=$work/cudaload-cache TORCHINDUCTOR_CACHE_DIR=$work/inductor/shared \
  timeout 160 python -m cudaload precompile --decode "$work/Qwen3-8B" --seq-len 5512 --batch-size 1 \
  --new-tokens 5000 --json > "$out/precompile.json" 2> "$out/precompile.err"
echo "precompile rc=$? $(date +%T)" >> "$out/d1.log"
timeout 235 python benchmarks/bench_decode.py --out "$out/d2" --work "$work" \
  --runs "declared~:long,declared:long" --profile 1:declared:long --budget-s 228 2>&1 | log > "$out/d2.log"
rm -f "$out"/d*/results.md  # at most 8 files come back
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > "$out/gpu.txt" 2>&1
python -c "import torch, transformers; print(torch.__version__, torch.version.cuda, transformers.__version__)" >> "$out/gpu.txt" 2>&1
