#!/usr/bin/env bash
# Pack a released transformers for the device machine, which has transformers 5.17 and no network, inside the
# 64 MiB a device call may carry beside the FA4 wheels (59 MiB): the wheel without its model folders except
# qwen3, llama, qwen2 and auto (the benchmarks build Qwen3 shapes from configs), as .tslim/tslim.tar.xz.
#   benchmarks/slim_transformers.sh 5.22.2
# On the device, after `source .whl/env.sh`:
#   mkdir -p /tmp/tslim && tar xJf .tslim/tslim.tar.xz -C /tmp/tslim && export PYTHONPATH=/tmp/tslim:$PYTHONPATH
# (run 10 of benchmarks/results/2026-12-01-h200 used 5.22.2 this way: 1.3 MB packed; the device's
# huggingface-hub 1.33.0 and tokenizers satisfy its requirements).
set -euo pipefail
ver=${1:?usage: slim_transformers.sh VERSION}
root=$(git rev-parse --show-toplevel)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
python3 -m pip download -q --no-deps "transformers==$ver" -d "$tmp"
(cd "$tmp" && python3 -m zipfile -e transformers-*.whl x)
find "$tmp/x/transformers/models" -mindepth 1 -maxdepth 1 -type d \
  ! -name qwen3 ! -name qwen2 ! -name llama ! -name auto -exec rm -rf {} +
mkdir -p "$root/.tslim"
# in a git worktree .git is a file: ask git where the (shared) exclude file is
exclude=$(git -C "$root" rev-parse --path-format=absolute --git-path info/exclude)
mkdir -p "$(dirname "$exclude")"
grep -qx '/.tslim/' "$exclude" 2>/dev/null || echo '/.tslim/' >> "$exclude"
# the dist-info too: importlib.metadata (cudaload's detection, transformers' own checks) must see this version
tar cJf "$root/.tslim/tslim.tar.xz" -C "$tmp/x" transformers "transformers-$ver.dist-info"
du -h "$root/.tslim/tslim.tar.xz"
