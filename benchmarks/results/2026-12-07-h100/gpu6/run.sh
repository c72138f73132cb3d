source .whl/env.sh || exit 1
cd out/head
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site PYTHONUNBUFFERED=1
W=/tmp/cudaload-bench
log() { grep --line-buffered -v -e Warning -e warn; }
echo "start $(date +%T)" > $OUT/times.txt
timeout 130 python -m pytest -q -p no:cacheprovider -m gpu tests/test_layer_compile.py -x > $OUT/pytest.log 2>&1
echo "tests rc=$? $(date +%T)" >> $OUT/times.txt
left=$(( 395 - SECONDS ))
timeout $left python benchmarks/bench_train.py --out $OUT/t4 --work $W --shapes 8b --modes qlora --dists chat --methods cudaload-compiled,cudaload --budget-s $((left-5)) 2>&1 | log > $OUT/bench4.log
echo "Q $(date +%T)" >> $OUT/times.txt
rm -f $OUT/*/results.md
nvidia-smi --query-gpu=name --format=csv > $OUT/gpu.txt 2>&1
