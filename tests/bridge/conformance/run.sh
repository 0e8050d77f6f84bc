#!/usr/bin/env bash
# Runs the MCP conformance suite (@modelcontextprotocol/conformance, pinned below) for one spec
# revision against the bridge serving the suite's fixtures (onlineps_mcp_bridge_fixtures, a
# test-only build of onlineps_mcp_bridge: testing/mcp_fixtures/), with one PS shard
# and one worker behind it, all on ephemeral loopback ports. Everything started here is killed
# on exit.
# Usage: tests/bridge/conformance/run.sh REVISION    (2025-11-25 | 2026-07-28)
#   ONLINEPS_BIN_DIR: where onlineps_ps, onlineps_worker and onlineps_mcp_bridge_fixtures are
#                     (default: build/bin of this checkout).
# Exit code: the suite's. The baseline is expected-failures-REVISION.yml next to this script:
# an unexpected failure or warning fails the run, and so does a baseline entry that now passes.
# Needs node and npx on PATH and the npm registry (or a filled npm cache); the suite itself runs
# on the npm package node@22.
set -euo pipefail

readonly CONFORMANCE=@modelcontextprotocol/conformance@0.2.0-alpha.12
readonly START_TIMEOUT_S=60

here=$(cd "$(dirname "$0")" && pwd)
revision=${1:-}
case "$revision" in
  2025-11-25 | 2026-07-28) ;;
  *)
    echo "usage: $0 2025-11-25|2026-07-28" >&2
    exit 2
    ;;
esac
bin_dir=${ONLINEPS_BIN_DIR:-$here/../../../build/bin}
baseline=$here/expected-failures-$revision.yml
for tool in onlineps_ps onlineps_worker onlineps_mcp_bridge_fixtures; do
  if [[ ! -x $bin_dir/$tool ]]; then
    echo "run.sh: $bin_dir/$tool not found (build the project or set ONLINEPS_BIN_DIR)" >&2
    exit 1
  fi
done
[[ -f $baseline ]] || { echo "run.sh: $baseline not found" >&2; exit 1; }
command -v npx >/dev/null || { echo "run.sh: npx not found on PATH" >&2; exit 1; }

work=$(mktemp -d "${TMPDIR:-/tmp}/onlineps-conformance.XXXXXX")
pids=()
keep_work=0

# shellcheck disable=SC2317  # reached through the EXIT trap
cleanup() {
  local pid
  for pid in "${pids[@]}"; do
    kill -TERM "$pid" 2>/dev/null || true
  done
  # Give each process 5 s to stop cleanly, then kill it.
  for pid in "${pids[@]}"; do
    for _ in $(seq 50); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  if ((keep_work)); then
    echo "run.sh: logs and results kept in $work" >&2
  else
    rm -rf "$work"
  fi
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A child also dies when this script does, even by SIGKILL (a CTest timeout).
deathsig=()
if command -v setpriv >/dev/null; then deathsig=(setpriv --pdeathsig KILL --); fi

# start NAME COMMAND...: runs COMMAND in the background, logging to $work/NAME.log, and sets
# `endpoint` to the address it prints as "LISTENING <address>".
start() {
  local name=$1 log=$work/$1.log pid deadline
  shift
  : >"$log"  # exists before the child opens it: the loop below reads it at once
  "${deathsig[@]}" "$@" >"$log" 2>&1 &
  pid=$!
  pids+=("$pid")
  deadline=$((SECONDS + START_TIMEOUT_S))
  endpoint=
  while [[ -z $endpoint ]]; do
    endpoint=$(sed -n 's/^LISTENING \([^ ]*\).*$/\1/p' "$log" | head -n 1)
    [[ -n $endpoint ]] && break
    if ! kill -0 "$pid" 2>/dev/null || ((SECONDS >= deadline)); then
      echo "run.sh: $name did not start; the end of $log:" >&2
      tail -n 30 "$log" >&2
      exit 1
    fi
    sleep 0.1
  done
  echo "run.sh: $name listening on $endpoint" >&2
}

start ps "$bin_dir/onlineps_ps" --shard-index 0 --num-shards 1 --listen tcp://127.0.0.1:0 \
  --admin-port -1
start worker "$bin_dir/onlineps_worker" --ps "$endpoint" --listen tcp://127.0.0.1:0 --model text \
  --labels negative,positive --admin-port -1
start bridge "$bin_dir/onlineps_mcp_bridge_fixtures" --workers "$endpoint" --host 127.0.0.1 \
  --port 0 --admin-port -1
url=$endpoint

# From an empty directory, so npx finds no package.json of this checkout.
rc=0
(cd "$work" && "${deathsig[@]}" npx -y -p node@22 -p "$CONFORMANCE" -c \
  "conformance server --url '$url' --requirements '$revision' --expected-failures '$baseline' -o '$work/results'") ||
  rc=$?
if ((rc != 0)); then
  keep_work=1
  echo "run.sh: the conformance suite failed for $revision (exit $rc); the end of the bridge log:" >&2
  tail -n 30 "$work/bridge.log" >&2
fi
exit "$rc"
