#!/usr/bin/env bash
# The H200 suite, run on the device machine from the repo root after `source .whl/env.sh`.
#   benchmarks/gpu_suite.sh OUTDIR PART...
# parts (each bounded by its own timeout, so one slow part cannot eat the call):
#   env       cudaload env --json / doctor / demo
#   tests     every gpu-marked test, plus the fastload tests (TESTS_FILES: a subset)
#   fa4tests  the attention-backend GPU tests (run with the FA4 wheels)
#   fastload  benchmarks/bench_fastload.py (warm and cold, 0.6B and 8B shapes)
#   sweep     benchmarks/bench_fastload.py --sweep (staging threads x buffer size x pinning method)
#   load      benchmarks/run.py --sections load
#   memory    benchmarks/run.py --sections memory,overheads
#   choice    benchmarks/run.py --sections choice,firstuse   (FA4 wheels)
#   attention benchmarks/investigations/bench_attention.py: every backend through generate() on 8+ works (FA4 wheels;
#             superseded by benchmarks/bench_generate.py, run directly: benchmarks/README.md)
#   fresh     benchmarks/bench_fresh.py: process start to first forward, warm and cold (FRESH_ARGS)
#   profile   benchmarks/investigations/profile_fresh.py: cProfile / -X importtime of fresh plain vs cudaload (PROFILE_SHAPES)
#   memtrain  benchmarks/bench_memory_train.py: training peaks and fit boundaries (quant wheels)
#   serving   benchmarks/bench_serving.py: 64 mixed requests, both shapes (SERVING_S each; SERVING_VARIANTS JSON,
#             SERVING_PADDED batch sizes, SERVING_REPS)
#   parallel  benchmarks/bench_parallel.py: DDP / FSDP2 / TP / layer split on 2 GPUs
#   masked    benchmarks/investigations/bench_masked_transient.py: one masked paged attention layer, memory vs the plan's formula
#   servingeager  the serving plan cudaload makes with attn="eager" (0.6B), against the same with paged|sdpa
# DEV=cuda:N (or CUDA_VISIBLE_DEVICES) puts a single-GPU part on another GPU of a 2-GPU machine, so two
# parts can run side by side: `benchmarks/gpu_suite.sh OUT memtrain & DEV=1 benchmarks/gpu_suite.sh OUT serving`.
# Everything lands in OUTDIR/suite/, packed as OUTDIR/suite.tgz (the device tool returns at most 8 files).
set -u
out=$1; shift
dir=$out/suite${SUITE_TAG:-}; mkdir -p "$dir"
[ -n "${DEV:-}" ] && export CUDA_VISIBLE_DEVICES=${DEV#cuda:}
export PYTHONUNBUFFERED=1
t() { local s=$1; shift; timeout --kill-after=10 "$s" "$@"; echo "[exit $? after ${SECONDS}s: $*]"; }
for part in "$@"; do
  echo "=== $part (t=${SECONDS}s)"
  case $part in
    env) t 60 python -m cudaload env --json > "$dir/env.json"; t 60 python -m cudaload doctor > "$dir/doctor.txt" 2>&1
         t 120 python -m cudaload demo > "$dir/demo.txt" 2>&1; cat "$dir/demo.txt" | tail -8 ;;
    tests) t "${TESTS_S:-330}" python -m pytest -q -p no:cacheprovider -rs ${TESTS_FILES:-tests/test_fastload.py tests/test_fastload_gpu.py \
             tests/test_detection.py tests/test_gpu_load.py tests/test_hub_kernels_e2e.py tests/test_benchmarks.py} -m "gpu or not slow" \
             > "$dir/pytest-gpu.txt" 2>&1; tail -25 "$dir/pytest-gpu.txt" ;;
    fa4tests) t 150 python -m pytest -q -p no:cacheprovider -rs tests/test_gpu_load.py -k "backend or auto_load" \
             > "$dir/pytest-fa4.txt" 2>&1; tail -8 "$dir/pytest-fa4.txt" ;;
    fastload) t "${FASTLOAD_S:-280}" python benchmarks/bench_fastload.py --out "$dir/fastload" ${FASTLOAD_ARGS:-} > "$dir/fastload.log" 2>&1
              tail -30 "$dir/fastload.log" ;;
    sweep) t "${SWEEP_S:-300}" python benchmarks/bench_fastload.py --sweep --out "$dir/sweep" --reps 2 > "$dir/sweep.log" 2>&1
           tail -60 "$dir/sweep/sweep.md" ;;
    load) t "${LOAD_S:-500}" python benchmarks/run.py --out "$dir/load" --sections load --reps "${REPS:-3}" ${SHAPES:+--shapes $SHAPES} --budget-s "$(( ${LOAD_S:-500} - 40 ))" > "$dir/load.log" 2>&1
          tail -40 "$dir/load/results.md" ;;
    memory) t "${MEMORY_S:-240}" python benchmarks/run.py --out "$dir/memory" --sections memory,overheads --budget-s "$(( ${MEMORY_S:-240} - 30 ))" > "$dir/memory.log" 2>&1
            tail -40 "$dir/memory/results.md" ;;
    choice) t "${CHOICE_S:-420}" python benchmarks/run.py --out "$dir/choice" --sections choice,firstuse ${SHAPES:+--shapes $SHAPES} --budget-s "$(( ${CHOICE_S:-420} - 30 ))" > "$dir/choice.log" 2>&1
            tail -40 "$dir/choice/results.md" ;;
    attention) t "${ATTN_S:-450}" python benchmarks/investigations/bench_attention.py --out "$dir/attention" --budget-s "$(( ${ATTN_S:-450} - 30 ))" > "$dir/attention.log" 2>&1
            tail -40 "$dir/attention/results.md" ;;
    fresh) t "${FRESH_S:-330}" python benchmarks/bench_fresh.py --out "$dir/fresh" --budget-s "$(( ${FRESH_S:-330} - 30 ))" ${FRESH_ARGS:-} > "$dir/fresh.log" 2>&1
           tail -30 "$dir/fresh/fresh.md" ;;
    profile) t "${PROFILE_S:-240}" python benchmarks/investigations/profile_fresh.py --out "$dir/profile" --shapes "${PROFILE_SHAPES:-Qwen3-0.6B}" > "$dir/profile.log" 2>&1
             tail -8 "$dir/profile.log" ;;
    memtrain) t "${MEMTRAIN_S:-480}" python benchmarks/bench_memory_train.py --out "$dir/memtrain" --budget-s "$(( ${MEMTRAIN_S:-480} - 30 ))" ${MEMTRAIN_ARGS:-} > "$dir/memtrain.log" 2>&1
              tail -30 "$dir/memtrain.log" ;;
    serving) for shape in ${SERVING_SHAPES:-Qwen3-0.6B Qwen3-8B}; do
               t "${SERVING_S:-270}" python benchmarks/bench_serving.py --out "$dir/serving-$shape" --shapes "$shape" --budget-s "$(( ${SERVING_S:-270} - 20 ))" --reps "${SERVING_REPS:-1}" ${SERVING_VARIANTS:+--variants "$SERVING_VARIANTS"} ${SERVING_PADDED+--padded "$SERVING_PADDED"} > "$dir/serving-$shape.log" 2>&1
               tail -20 "$dir/serving-$shape.log"; done ;;
    parallel) t "${PARALLEL_S:-300}" python benchmarks/bench_parallel.py --out "$dir/parallel" --budget-s "$(( ${PARALLEL_S:-300} - 20 ))" ${PARALLEL_ARGS:-} > "$dir/parallel.log" 2>&1
              tail -30 "$dir/parallel.log" ;;
    masked) t "${MASKED_S:-240}" python benchmarks/investigations/bench_masked_transient.py --out "$dir/masked" --budget-s "$(( ${MASKED_S:-240} - 20 ))" > "$dir/masked.log" 2>&1
            tail -20 "$dir/masked.log" ;;
    servingeager)
      settings=$(python -c 'import json, cudaload; from cudaload.testing import full_config; p = cudaload.plan(full_config("Qwen3-0.6B"), intent="serving", attn="eager", seq_len=2304, batch_size=64); print(json.dumps(p.serving.settings()))')
      t "${SERVINGEAGER_S:-420}" python benchmarks/bench_serving.py --out "$dir/serving-eager" --shapes Qwen3-0.6B --padded '' --settings "$settings" --variants '{"sdpa-same": {"attn_implementation": "paged|sdpa"}}' --budget-s "$(( ${SERVINGEAGER_S:-420} - 20 ))" > "$dir/serving-eager.log" 2>&1
      tail -20 "$dir/serving-eager.log" ;;
    *) echo "unknown part $part" ;;
  esac
done
tar czf "$out/suite${SUITE_TAG:-}.tgz" -C "$out" "suite${SUITE_TAG:-}"
