source .whl/env.sh || exit 1
cd out/head
export PYTHONPATH=$PWD/src:$PWD/benchmarks:/tmp/site
W=/tmp/cudaload-bench
log() { grep --line-buffered -v -e Warning -e warn; }
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv > $OUT/gpu.txt 2>&1
python -c "import torch, transformers, peft, bitsandbytes; print(torch.__version__, torch.version.cuda, transformers.__version__, peft.__version__, bitsandbytes.__version__)" >> $OUT/gpu.txt 2>&1
echo "start $(date +%T)" > $OUT/times.txt
timeout 110 python benchmarks/investigations/train_step_profile.py --shape 8b --out $OUT/prof_eager.json --warmup 4 --steps 4 --work $W > $OUT/prof_eager.log 2>&1
echo "eager $(date +%T)" >> $OUT/times.txt
timeout 170 python benchmarks/investigations/train_step_profile.py --shape 8b --out $OUT/prof_compiled.json --warmup 6 --steps 4 --compile-layers --work $W > $OUT/prof_compiled.log 2>&1
echo "compiled $(date +%T)" >> $OUT/times.txt
timeout 280 python benchmarks/bench_train.py --out $OUT/t1 --work $W --shapes 8b --modes lora,qlora --dists chat --methods plain,cudaload --budget-s 270 2>&1 | log > $OUT/bench1.log
echo "bench $(date +%T)" >> $OUT/times.txt
rm -f $OUT/*/results.md
tail -c 3000 $OUT/prof_compiled.log > $OUT/prof_compiled.tail; rm -f $OUT/prof_compiled.log; tail -c 3000 $OUT/prof_eager.log > $OUT/prof_eager.tail; rm $OUT/prof_eager.log
