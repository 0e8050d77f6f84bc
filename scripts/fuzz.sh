#!/usr/bin/env bash
# Builds the libFuzzer targets (fuzz/) with clang into build-fuzz/ and runs each for a
# bounded time on a copy of its seed corpus, after replaying its regression inputs
# (fuzz/regressions/<target>/). Exits non-zero on any crash, leak, timeout or
# out-of-memory, naming the reproducer; 77 (a skip for ctest) when clang or its libFuzzer
# runtime is missing. docs/reliability.md, "Fuzzing".
# Usage: scripts/fuzz.sh [SECONDS_PER_TARGET]   (default 30)
#        scripts/fuzz.sh --build-only            (builds the targets and stops)
# Env: ONLINEPS_FUZZ_BUILD_DIR (build-fuzz), ONLINEPS_FUZZ_TARGETS ("wire_fuzz mcp_fuzz
#      trace_fuzz"), ONLINEPS_FUZZ_OUT (kept work dir; default a fresh temp dir),
#      ONLINEPS_JOBS (2), CXX (clang++).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build_only=0
if [[ ${1:-} == --build-only ]]; then
  build_only=1
  shift
fi
seconds=${1:-30}
if ! [[ $seconds =~ ^[0-9]+$ ]] || ((seconds < 1)); then
  echo "fuzz: SECONDS_PER_TARGET must be a positive integer, not '$seconds'" >&2
  exit 2
fi
build=${ONLINEPS_FUZZ_BUILD_DIR:-$root/build-fuzz}
targets=${ONLINEPS_FUZZ_TARGETS:-wire_fuzz mcp_fuzz trace_fuzz}
jobs=${ONLINEPS_JOBS:-2}
cxx=${CXX:-clang++}
[[ $cxx == *clang* ]] || cxx=clang++  # the main build's CXX may be g++
if ! command -v "$cxx" >/dev/null; then
  if command -v clang++-14 >/dev/null; then cxx=clang++-14; else
    echo "fuzz: clang++ not found: install clang (Debian: apt-get install clang-14)" >&2
    exit 77
  fi
fi
cc=${cxx/clang++/clang}

work=${ONLINEPS_FUZZ_OUT:-}
if [[ -z $work ]]; then
  work=$(mktemp -d "${TMPDIR:-/tmp}/onlineps-fuzz.XXXXXX")
fi
mkdir -p "$work"

# libFuzzer's runtime ships separately from the compiler on some systems: say so plainly.
probe="$work/probe"
printf '%s\n' '#include <cstddef>' '#include <cstdint>' \
  'extern "C" int LLVMFuzzerTestOneInput(const uint8_t*, size_t) { return 0; }' >"$probe.cc"
if ! "$cxx" -fsanitize=fuzzer,address,undefined "$probe.cc" -o "$probe" 2>"$probe.log"; then
  echo "fuzz: $cxx cannot link -fsanitize=fuzzer,address,undefined (is the libFuzzer" \
    "runtime libclang_rt.fuzzer installed? Debian: libclang-rt-14-dev):" >&2
  cat "$probe.log" >&2
  exit 77
fi
rm -f "$probe" "$probe.cc" "$probe.log"

if [[ ! -f $build/CMakeCache.txt ]]; then
  CC=$cc CXX=$cxx cmake -S "$root/fuzz" -B "$build" >"$work/configure.log" 2>&1 || {
    cat "$work/configure.log" >&2
    exit 2
  }
fi
# shellcheck disable=SC2086  # $targets is a list of names
cmake --build "$build" -j "$jobs" --target $targets >"$work/build.log" 2>&1 || {
  tail -n 50 "$work/build.log" >&2
  echo "fuzz: build failed (log: $work/build.log)" >&2
  exit 2
}
if ((build_only)); then
  [[ -n ${ONLINEPS_FUZZ_OUT:-} ]] || rm -rf "$work"
  echo "fuzz: built $targets in $build"
  exit 0
fi

# ASan must not mask a leak or an out-of-memory as success.
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:allocator_may_return_null=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
limits=(-rss_limit_mb=2048 -malloc_limit_mb=1024 -timeout=10)
# One target per job: each fuzzer is single-threaded.
fuzz_target() {
  local t=$1 bin regressions dict log stats a
  bin="$build/$t"
  mkdir -p "$work/$t/corpus" "$work/$t/artifacts"
  regressions=()
  if [[ -d $root/fuzz/regressions/$t ]]; then
    while IFS= read -r -d '' f; do regressions+=("$f"); done \
      < <(find "$root/fuzz/regressions/$t" -type f ! -name '*.md' -print0 | sort -z)
  fi
  if ((${#regressions[@]} > 0)); then
    if ! "$bin" "${limits[@]}" "${regressions[@]}" >"$work/$t/regressions.log" 2>&1; then
      echo "fuzz: $t FAILED on a regression input (log: $work/$t/regressions.log)" >&2
      grep -E '^Running: ' "$work/$t/regressions.log" | tail -n 1 >&2 || true
      return 1
    fi
  fi
  cp -r "$root/fuzz/corpus/$t/." "$work/$t/corpus/"
  dict=()
  [[ -f $root/fuzz/$t.dict ]] && dict=(-dict="$root/fuzz/$t.dict")
  log="$work/$t/fuzz.log"
  if "$bin" "${limits[@]}" "${dict[@]}" -max_total_time="$seconds" -print_final_stats=1 \
    -artifact_prefix="$work/$t/artifacts/" "$work/$t/corpus" >"$log" 2>&1; then
    stats=$(grep -E '^#[0-9]+' "$log" | tail -n 1)
    echo "fuzz: $t ok: ${seconds}s, ${regressions[*]:+${#regressions[@]} regressions, }$stats"
  else
    echo "fuzz: $t FAILED (log: $log)" >&2
    grep -E 'ERROR: |SUMMARY: |_fuzz: ' "$log" | head -n 5 >&2 || true
    for a in "$work/$t/artifacts"/*; do
      [[ -e $a ]] || continue
      echo "fuzz: reproducer: $a" >&2
      echo "fuzz:   rerun: $bin $a" >&2
      echo "fuzz:   minimize: $bin -minimize_crash=1 -runs=10000 $a; then add it to" \
        "fuzz/regressions/$t/" >&2
    done
    return 1
  fi
}
failed=0
running=0
for t in $targets; do
  if ((running >= jobs)); then
    wait -n || failed=1
    running=$((running - 1))
  fi
  fuzz_target "$t" &
  running=$((running + 1))
done
for ((; running > 0; running--)); do wait -n || failed=1; done
if ((failed)); then
  echo "fuzz: FAILED (work dir kept: $work)" >&2
  exit 1
fi
[[ -n ${ONLINEPS_FUZZ_OUT:-} ]] || rm -rf "$work"
echo "fuzz: all targets passed"
