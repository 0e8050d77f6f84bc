#!/usr/bin/env bash
# Sets everything up, builds, and runs the whole test suite (this is what CI runs).
# Usage: scripts/test.sh [ctest args...]   e.g. scripts/test.sh -R Dedup
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
"$root/scripts/setup.sh"
"$root/scripts/build.sh"
# clang proves the locking annotations (common/mutex.h); -fsyntax-only, no second build.
# Product code, test helpers and the one test file with annotated state of its own (103
# of 157 units; the other gtest files and the benchmarks cost ~40% of the check and
# annotate nothing). scripts/check_thread_safety.sh without an argument checks them all.
"$root/scripts/check_thread_safety.sh" '^(?!.*(/tests/.*(?<!rpc_calls)_test\.cc$|/bench/))'
build=${ONLINEPS_BUILD_DIR:-$root/build}
jobs=${ONLINEPS_JOBS:-$(nproc)}
cd "$build"
ctest --output-on-failure --timeout 600 -j "$jobs" "$@"
