#!/usr/bin/env bash
# Packs flash-attn-4 (with its CuTe DSL), bitsandbytes and liger-kernel into one call's 64 MiB for the H200
# device machine: ../shared/device/wheels.sh ships them as wheels (fa4 59 MiB, quant 41 MiB: two calls). Here
# every wheel is unpacked into one tree and xz-compressed (~9 MiB where the wheels are ~14 MiB), bitsandbytes
# keeps only its CUDA 13.0 library (the machine's torch is cu130), torch-c-dlpack-ext none (it ships no addon for
# torch 2.11). The cutlass cu13 tree is carried as wheels.sh packs it.
#   usage (from the project root): benchmarks/pack_device_site.sh   -> .whl/ (ignored by git)
#   there:  source .whl/env.sh   (unpacks into /tmp/site, puts src/ and it on PYTHONPATH, HF_HUB_OFFLINE=1)
set -euo pipefail
root=$(git rev-parse --show-toplevel)
cd "$root"
shared=$(cd ../shared/device && pwd)
"$shared/wheels.sh" fa4 liger >/dev/null
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_24_x86_64 -d "$tmp/w" bitsandbytes==0.50.2 2>/dev/null
mkdir "$tmp/site"
for w in .whl/*.whl "$tmp"/w/*.whl; do python3 -m zipfile -e "$w" "$tmp/site"; done
rm -f "$tmp"/site/bitsandbytes/libbitsandbytes_{cuda1[0-2]*,cuda13[1-9]*,rocm*,xpu*}.so
rm -f "$tmp"/site/torch_c_dlpack_ext/*.so
tar cJf "$tmp/site.tar.xz" -C "$tmp/site" .
rm -f .whl/*.whl
mv "$tmp/site.tar.xz" .whl/
cat > .whl/env.sh <<'ENV'
# On the device machine, from the repo root: source .whl/env.sh
mkdir -p /tmp/site && for t in .whl/*.tar.xz; do tar xJf "$t" -C /tmp/site || return 1; done
# cutlass is found through a .pth file, which PYTHONPATH does not process: name its folder too
export PYTHONPATH=$PWD/src:/tmp/site:/tmp/site/nvidia_cutlass_dsl/dsl_packages${PYTHONPATH:+:$PYTHONPATH}
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
ENV
du -sh .whl
