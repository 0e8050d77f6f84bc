#!/usr/bin/env bash
# Configures and builds onlineps into build/ (or $ONLINEPS_BUILD_DIR).
# Usage: scripts/build.sh [extra cmake args...]
# CUDA/NCCL code is built only when asked for (-DONLINEPS_WITH_NCCL=ON or AUTO); a build
# dir configured before OFF became the default keeps its cached value (the configure
# summary below says which). -DONLINEPS_WITH_TORCH=OFF builds the torch-free binaries only.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ONLINEPS_BUILD_DIR:-$root/build}
jobs=${ONLINEPS_JOBS:-$(nproc)}
configure=$(cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@")
# The optional parts (NCCL, torch) say whether they are built, so nothing is on unseen.
grep '^-- onlineps:' <<<"$configure" | sed 's/^-- /build: /' || true
echo "build: compiling with $jobs jobs into $build"
cmake --build "$build" -j "$jobs"
