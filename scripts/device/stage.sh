#!/usr/bin/env bash
# Stage the pack parts this call carries (.gpu-pack/part-N, named in the device tool's `carry`) under /tmp on the
# device, where the next calls find them while the machine stays warm (calls under 30 s apart). docs/gpu.md.
set -eu
PACK=${TOOLAUDIT_PACK:-/tmp/toolaudit-pack}
SRC=${1:-.gpu-pack}
mkdir -p "$PACK"
found=0
for part in "$SRC"/part-*; do
    [ -d "$part" ] || continue
    cp "$part"/* "$PACK"/
    found=1
done
[ "$found" = 1 ] || { echo "stage: no $SRC/part-* here (name it in carry)"; exit 2; }
ls -l "$PACK"
