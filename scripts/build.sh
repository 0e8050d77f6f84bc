#!/usr/bin/env bash
# Configures and builds onlineps into build/ (or $ONLINEPS_BUILD_DIR).
# Usage: scripts/build.sh [extra cmake args...]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ONLINEPS_BUILD_DIR:-$root/build}
jobs=${ONLINEPS_JOBS:-$(nproc)}
cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=RelWithDebInfo "$@" >/dev/null
echo "build: compiling with $jobs jobs into $build"
cmake --build "$build" -j "$jobs"
