#!/usr/bin/env bash
# Packs TRL 1.16.0 and datasets 5.2.0 (with what the GPU machine's image lacks or may hold too old) into one
# call's 64 MiB, as benchmarks/pack_device_site.sh packs flash-attn-4: every wheel unpacked into one tree (the
# .dist-info folders kept: datasets reads pyarrow's version through importlib.metadata, datasets/config.py:39),
# what is never imported dropped, xz-compressed. For issue 44 item 5 (benchmarks/gpu_train_suite.sh 7: TRL's
# SFTTrainer on sft_config_arguments against cudaload's Trainer path).
#   The image (/work/.library/device/KINDS.md) has transformers 5.17.0, accelerate, peft, huggingface_hub 1.33.0,
#   pandas, pyarrow, fsspec, xxhash, jinja2, psutil, requests, aiohttp, pyyaml, tqdm, packaging, numpy; not trl,
#   datasets, dill, multiprocess. Its pyarrow and fsspec versions are unknown: datasets 5.2.0 needs pyarrow>=24
#   and fsspec<=2026.9.0, so both are carried (pyarrow without its C++ headers, Cython sources, tests and the
#   Flight / Substrait / Gandiva libraries, which datasets never imports); xxhash too (small). pandas, jinja2,
#   psutil, huggingface_hub come from the image (trl: pandas>=2.1.1, psutil, jinja2; datasets: hub>=1.31.0).
#   bitsandbytes 0.50.2 too, with only its CUDA 13.0 library (the machine's torch is cu130): 28 MiB in all
#   with it (WITH_BNB=0: without).
#   usage (from the project root): benchmarks/pack_trl_site.sh   -> .whl/ (ignored by git; replaces what is there)
#   there:  source .whl/env.sh   (unpacks into /tmp/trl/site-packages, puts src/ and it on PYTHONPATH, HF_HUB_OFFLINE=1)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
dl() {
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_24_x86_64 \
    --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform any -d "$tmp/w" "$@"
}
dl trl==1.16.0 datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 pyarrow==26.0.1 fsspec==2026.9.0 xxhash==4.1.0
if [[ ${WITH_BNB:-1} == 1 ]]; then dl bitsandbytes==0.50.2; fi
mkdir "$tmp/site"
for w in "$tmp"/w/*.whl; do python3 -m zipfile -e "$w" "$tmp/site"; done
s=$tmp/site
# tests; pyarrow: headers, Cython sources, its test suite, Flight and S3 (libarrow_flight, libarrow_s3: only
# pyarrow.flight and pyarrow._s3fs load them, and pyarrow.fs imports _s3fs in a try), and the link-time copies of
# libarrow_python*.so (the extension modules load the .so.2600 names; readelf -d). libarrow_substrait stays:
# pyarrow.lib itself needs it
rm -rf "$s"/multiprocess/tests "$s"/dill/tests "$s"/pyarrow/tests "$s"/pyarrow/include "$s"/pyarrow/src
rm -f "$s"/pyarrow/*.pyx "$s"/pyarrow/*.pxd "$s"/pyarrow/*.pxi "$s"/pyarrow/includes/*.pxd
rm -f "$s"/pyarrow/libarrow_flight.so* "$s"/pyarrow/libarrow_python_flight.so* "$s"/pyarrow/_flight*.so
rm -f "$s"/pyarrow/libarrow_s3.so* "$s"/pyarrow/_s3fs*.so "$s"/pyarrow/_pyarrow_cpp_tests*.so
rm -f "$s"/pyarrow/libarrow_python{,_parquet_encryption}.so{,.2600.*}
rm -f "$s"/bitsandbytes/libbitsandbytes_{cuda1[0-2]*,cuda13[1-9]*,rocm*,xpu*}.so 2>/dev/null || true
find "$s" -name __pycache__ -type d -prune -exec rm -rf {} +
tar cJf "$tmp/site.tar.xz" -C "$s" .
rm -rf .whl
mkdir .whl
mv "$tmp/site.tar.xz" .whl/trl-site.tar.xz
cat > .whl/env.sh <<'ENV'
# On the device machine, from the repo root: source .whl/env.sh  (TRL's pack: benchmarks/pack_trl_site.sh)
# a folder named site-packages: dill pickles a module outside one by value (dill _is_builtin_module), and
# datasets' fingerprint of a Dataset.from_list then fails on pyarrow's MonthDayNano (seen with /tmp/site)
mkdir -p /tmp/trl/site-packages && for t in .whl/*.tar.xz; do tar xJf "$t" -C /tmp/trl/site-packages || return 1; done
export PYTHONPATH=$PWD/src:/tmp/trl/site-packages${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1 PYTHONUNBUFFERED=1
ENV
du -sh .whl
