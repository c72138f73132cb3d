source .whl/env.sh || exit 1
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages PYTHONUNBUFFERED=1
export FLASH_ATTENTION_CUTE_DSL_CACHE_ENABLED=1 FLASH_ATTENTION_CUTE_DSL_CACHE_DIR=/tmp/fa4cache
W=/tmp/cudaload-bench
log() { grep --line-buffered -v -e Warning -e warn; }
echo "start $(date +%T)" > $OUT/times.txt
python -c "import torch, transformers, flash_attn.cute; print(torch.__version__, transformers.__version__)" > $OUT/gpu.txt 2>&1
timeout 185 python benchmarks/bench_train.py --out $OUT/t5 --work $W --shapes 8b --modes lora --dists chat --methods cudaload,cudaload-varlen,cudaload-compiled --budget-s 180 2>&1 | log > $OUT/bench5.log
echo "end $(date +%T)" >> $OUT/times.txt
rm -f $OUT/*/results.md
