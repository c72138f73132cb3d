source .whl/env.sh || exit 1
cd out/head
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site
W=/tmp/cudaload-bench
log() { grep --line-buffered -v -e Warning -e warn; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt 2>&1
python -c "import torch, transformers, peft, bitsandbytes; print(torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, bitsandbytes.__version__)" >> $OUT/gpu.txt 2>&1
echo "start $(date +%T)" > $OUT/times.txt
timeout 100 python -m pytest -q -p no:cacheprovider -m gpu tests/test_layer_compile.py 2>&1 | tail -30 > $OUT/pytest.log
echo "tests $(date +%T)" >> $OUT/times.txt
timeout 215 python benchmarks/bench_train.py --out $OUT/t1 --work $W --shapes 8b --modes lora --dists chat --methods cudaload-compiled,cudaload,plain --budget-s 205 2>&1 | log > $OUT/bench1.log
echo "A $(date +%T)" >> $OUT/times.txt
timeout 125 python benchmarks/bench_train.py --out $OUT/t2 --work $W --shapes 8b --modes lora,qlora --dists chat --methods cudaload-compiled --budget-s 120 2>&1 | log > $OUT/bench2.log
echo "B $(date +%T)" >> $OUT/times.txt
left=$(( 560 - SECONDS )); [ $left -gt 40 ] && timeout $left python benchmarks/bench_train.py --out $OUT/t3 --work $W --shapes 8b --modes lora --dists docs --methods cudaload-compiled,cudaload,plain --budget-s $((left-5)) 2>&1 | log > $OUT/bench3.log
echo "C $(date +%T)" >> $OUT/times.txt
rm -f $OUT/*/results.md
