#!/usr/bin/env bash
# What benchmarks/gpu.sh needs carried to a lent GPU machine, made on this one (it reaches the
# package registry; the GPU machine reaches nothing):
#
#     benchmarks/gpu_kit.sh [COMMIT]
#
# .whl/: the wheels the device's image lacks (polars 1.x built for CPython 3.12, tomli_w), which
# gpu.sh installs there; with COMMIT, .before/src: that commit's src, for gpu.sh b500's
# side-by-side (BEFORE_SRC=.before/src). Then carry [".whl", ".before"] to
# `benchmarks/gpu.sh OUTDIR PART...`.
set -eu
py=${PYTHON:-python3}
rm -rf .whl
$py -m pip download -q polars==1.33.1 tomli_w --python-version 3.12 --implementation cp \
    --only-binary=:all: --platform manylinux_2_17_x86_64 --no-deps -d .whl
if [ -n "${1:-}" ]; then
    rm -rf .before && mkdir -p .before && git archive "$1" src | tar -x -C .before
fi
du -sh .whl ${1:+.before}
