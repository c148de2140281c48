#!/usr/bin/env bash
# `make gpu-pack-check`: the pack's offline install, tested on this machine (docs/gpu.md).
# 1. pack for this machine's Python into .gpu-pack-local (as `make gpu-pack` does for the device's);
# 2. a fresh venv that stands in for the device image: the CPU torch and the packages device_has.txt lists that
#    our code uses (from the index: the device has them already);
# 3. stage the parts one by one (as the device calls do) and run run.sh's install step: no index, parts only;
# 4. run.sh's tests step: the gpu tests, which skip without CUDA.
set -eu
PY=${PY:-python3}
ROOT=$(cd "$(dirname "$0")/../.." && pwd)
cd "$ROOT"
WORK=$(mktemp -d /tmp/toolaudit-pack-check.XXXX)
trap 'rm -rf "$WORK"' EXIT
version=$("$PY" -c 'import sys; print(f"{sys.version_info[0]}.{sys.version_info[1]}")')
"$PY" scripts/device/pack.py --python-version "$version" --out .gpu-pack-local
"$PY" -m venv "$WORK/venv"
"$WORK/venv/bin/pip" install -q --upgrade pip
"$WORK/venv/bin/pip" install -q torch==2.13.0
"$WORK/venv/bin/pip" install -q 'transformers>=4.46,<5.20' accelerate numpy pytest pytest-xdist click aiohttp pyarrow regex \
    prometheus_client pyyaml tqdm
for part in .gpu-pack-local/part-*; do  # one part per call on the device: staged one by one here too
    mkdir -p "$WORK/carried" && rm -rf "$WORK/carried"/* && cp -r "$part" "$WORK/carried/"
    TOOLAUDIT_PACK="$WORK/pack" bash scripts/device/stage.sh "$WORK/carried" >/dev/null
done
OUT="$WORK/out" PY="$WORK/venv/bin/python" TOOLAUDIT_PACK="$WORK/pack" TOOLAUDIT_CACHE="$WORK/cache" \
    PACK_SRC=none STEPS="install tests" bash scripts/device/run.sh
grep -q "install rc=0" "$WORK/out/steps.txt"
grep -q "tests rc=0" "$WORK/out/steps.txt" || grep -q "tests rc=5" "$WORK/out/steps.txt"
grep -q "skipped" "$WORK/out/tests.log"
echo "gpu-pack-check: the parts installed offline into a fresh venv and the gpu tests ran (skipped: no CUDA)"
