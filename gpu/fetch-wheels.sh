#!/bin/bash
# Run HERE (a machine that reaches the package registry), in the repository root: downloads the
# wheels gpu/wheels.txt lists, built for the GPU image's Python (3.12, x86-64 manylinux), into
# .whl/ (git-ignored; carry it to the GPU machine with the working tree: the device tool's
# `carry: [".whl"]`). gpu/check.sh installs them there with pip, offline.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
DEST=${WHEELS:-.whl}
mkdir -p "$DEST"
platforms=()
for p in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 \
  manylinux2014_x86_64 manylinux_2_31_x86_64 manylinux_2_34_x86_64 manylinux1_x86_64; do
  platforms+=(--platform "$p")
done
grep -v '^#' gpu/wheels.txt | grep -v '^\s*$' | while read -r req; do
  "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
    --implementation cp "${platforms[@]}" -d "$DEST" "$req"
done
du -sh "$DEST"
ls "$DEST"
