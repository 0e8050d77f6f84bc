#!/usr/bin/env bash
# Sets everything up, builds, and runs the whole test suite (this is what CI runs).
# Usage: scripts/test.sh [ctest args...]   e.g. scripts/test.sh -R Dedup
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
# clang proves the locking annotations (common/mutex.h); -fsyntax-only, no second build.
"$root/scripts/check_thread_safety.sh"
build=${ONLINEPS_BUILD_DIR:-$root/build}
jobs=${ONLINEPS_JOBS:-$(nproc)}
cd "$build"
ctest --output-on-failure --timeout 600 -j "$jobs" "$@"
