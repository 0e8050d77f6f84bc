#!/usr/bin/env bash
# Clang's thread-safety analysis over the whole tree, warnings as errors: every member
# declared GUARDED_BY is touched only under its lock, every REQUIRES helper is called
# with it held, and locks are taken in their ACQUIRED_BEFORE order (common/mutex.h).
# Configures a clang build dir (build-tsa/, or $ONLINEPS_TSA_BUILD_DIR) and runs each
# translation unit of compile_commands.json (libraries, tools, tests, benchmarks, the
# torch models too) with -fsyntax-only: the analysis runs, no code is generated, nothing
# is linked, so no torch object is built twice. Other clang warnings do not fail it.
# Usage: scripts/check_thread_safety.sh [regex on source paths]   (default: all)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${ONLINEPS_TSA_BUILD_DIR:-$root/build-tsa}
jobs=${ONLINEPS_JOBS:-$(nproc)}
filter=${1:-.}
start=$(date +%s)
# Debian's clang-14 installs clang++-14; the clang package adds the plain name.
cxx=clang++
command -v "$cxx" >/dev/null || cxx=clang++-14
command -v "$cxx" >/dev/null || {
  echo "check_thread_safety: clang++ not found: install clang (Debian: apt-get install clang-14)" >&2
  exit 1
}

cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Debug \
  -DCMAKE_CXX_COMPILER="$cxx" \
  -DONLINEPS_THREAD_SAFETY_CHECK=ON -DONLINEPS_WITH_NCCL=OFF \
  -DCMAKE_DISABLE_PRECOMPILE_HEADERS=ON >/dev/null

/usr/bin/python3 - "$root" "$build" "$jobs" "$filter" <<'EOF'
import collections, concurrent.futures, json, os, re, shlex, subprocess, sys

root, build, jobs, pattern = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
entries = [e for e in json.load(open(f"{build}/compile_commands.json"))
           if e["file"].startswith(root + "/") and e["file"].endswith((".cc", ".cpp"))
           and re.search(pattern, e["file"])]

def flags(e):
    args = shlex.split(e["command"])
    out, skip = [], False
    for a in args[1:]:  # no object, no dependency file, no source: flags only
        if skip:
            skip = False
        elif a in ("-o", "-MT", "-MF"):
            skip = True
        elif a not in ("-MD", "-MMD", "-c") and \
                os.path.join(e["directory"], a) != e["file"]:
            out.append(a)
    return args[0], out

# The torch units (5 of them) spend half their ~14 s parsing libtorch's headers: units
# compiled with the same torch flags share one precompiled header of those (measured:
# 14.5 -> 7.5 s a unit). For the other units a shared prelude of the standard, JSON,
# spdlog, ZeroMQ and msgpack headers was measured too and did not pay (2.7 -> 2.9 s).
groups = collections.defaultdict(list)
for e in entries:
    cxx, f = flags(e)
    groups[(cxx, tuple(f))].append(e)

def torch_pch(i, key):
    cxx, f = key
    header = f"{build}/tsa-torch-{i}.h"
    with open(header, "w") as h:
        h.write("#include <torch/torch.h>\n#include <torch/script.h>\n")
    p = subprocess.run([cxx, *f, "-x", "c++-header", header, "-Xclang", "-emit-pch",
                        "-o", header + ".pch"], cwd=build, capture_output=True, text=True)
    return header + ".pch" if p.returncode == 0 else None

def check(e, key, pch):
    cxx, f = key
    extra = ["-include-pch", pch] if pch else []
    p = subprocess.run([cxx, *f, *extra, "-fsyntax-only", e["file"]], cwd=e["directory"],
                       capture_output=True, text=True)
    return e["file"], p.returncode, p.stderr

failed = 0
with concurrent.futures.ThreadPoolExecutor(jobs) as pool:
    torch = [k for k, v in groups.items()
             if len(v) > 1 and any(a.startswith("-DUSE_DISTRIBUTED") for a in k[1])]
    pchs = dict(zip(torch, pool.map(lambda ik: torch_pch(*ik), enumerate(torch))))
    # The longest units first, so that no long one starts last.
    work = [(e, k, pchs.get(k))
            for k, v in sorted(groups.items(), key=lambda kv: kv[0] not in pchs) for e in v]
    for path, rc, err in pool.map(lambda w: check(*w), work):
        if rc != 0:
            failed += 1
            print(f"FAILED {path[len(root) + 1:]}\n{err}", flush=True)
print(f"check_thread_safety: {len(entries)} translation units, {failed} failed")
sys.exit(1 if failed else 0)
EOF
echo "check_thread_safety: passed in $(($(date +%s) - start)) s"
