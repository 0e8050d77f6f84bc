#!/usr/bin/env bash
# Every binary's /metrics passes `promtool check metrics` (Prometheus naming: _total on
# counters, base units, help text, no bad label names), /healthz, /livez and /readyz
# answer 200 once it serves, and readiness (not liveness) follows the dependencies. Starts a PS shard, a worker and the MCP bridge on loopback,
# makes a few MCP calls so histograms and labelled counters have samples, then checks.
# Usage: tests/system/metrics_lint.sh    (ONLINEPS_BIN_DIR: the binaries; PROMTOOL: promtool)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
bin=${ONLINEPS_BIN_DIR:-$here/../../build/bin}
promtool=${PROMTOOL:-$here/../../build/tools/prom/usr/bin/promtool}
if [ ! -x "$promtool" ]; then
  promtool=$(command -v promtool || true)
fi
if [ -z "$promtool" ]; then
  echo "metrics_lint: promtool not found (scripts/setup.sh unpacks it into build/tools/prom)" >&2
  exit 1
fi
work=$(mktemp -d /tmp/onlineps-metrics.XXXXXX)
pids=()
# shellcheck disable=SC2317  # called by the trap
cleanup() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  rm -rf "$work"
}
trap cleanup EXIT

free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# wait_line FILE PREFIX: the rest of the first line of FILE starting with PREFIX.
wait_line() {
  for _ in $(seq 300); do
    if grep -q "^$2" "$1" 2>/dev/null; then
      grep -m1 "^$2" "$1" | cut -d' ' -f2
      return 0
    fi
    sleep 0.1
  done
  echo "metrics_lint: no '$2' line in $1:" >&2
  cat "$1" >&2
  return 1
}

ps_admin=$(free_port) worker_admin=$(free_port)
"$bin/onlineps_ps" --shard-index 0 --num-shards 1 --listen tcp://127.0.0.1:0 \
  --checkpoint-dir "$work/ckpt" --checkpoint-interval-s 3600 \
  --admin-port "$ps_admin" --log-level warn >"$work/ps.out" 2>&1 &
pids+=($!)
ps_ep=$(wait_line "$work/ps.out" LISTENING)
"$bin/onlineps_worker" --ps "$ps_ep" --listen tcp://127.0.0.1:0 --model text \
  --labels negative,positive --admin-port "$worker_admin" --log-level warn >"$work/worker.out" 2>&1 &
pids+=($!)
worker_ep=$(wait_line "$work/worker.out" LISTENING)
"$bin/onlineps_mcp_bridge" --workers "$worker_ep" --port 0 --admin-port 0 --log-level warn \
  >"$work/bridge.out" 2>&1 &
pids+=($!)
bridge_admin=$(wait_line "$work/bridge.out" ADMIN)
url=$(wait_line "$work/bridge.out" LISTENING)

hdr=(-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream')
sid=$(curl -sS -D - -o /dev/null "${hdr[@]}" "$url" -d '{"jsonrpc":"2.0","id":0,"method":"initialize",
  "params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"lint","version":"1"}}}' |
  tr -d '\r' | awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}')
for call in '{"name":"learn","arguments":{"text":"good","label":"positive"}}' \
  '{"name":"infer","arguments":{"text":"good"}}' '{"name":"infer","arguments":{"bad":1}}'; do
  curl -sS -o /dev/null "${hdr[@]}" -H "Mcp-Session-Id: $sid" "$url" \
    -d "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":$call}"
done
sleep 1.5  # gauges are copied once a second

failed=0
for target in "ps:127.0.0.1:$ps_admin" "worker:127.0.0.1:$worker_admin" "bridge:$bridge_admin"; do
  name=${target%%:*} addr=${target#*:}
  for path in healthz livez readyz; do
    code=$(curl -s -o /dev/null -w '%{http_code}' "http://$addr/$path")
    if [ "$code" != 200 ]; then
      echo "metrics_lint: $name /$path answered $code" >&2
      failed=1
    fi
  done
  curl -sS "http://$addr/metrics" >"$work/$name.metrics"
  families=$(grep -c '^# TYPE' "$work/$name.metrics" || true)
  if [ "$families" -lt 3 ]; then
    echo "metrics_lint: $name /metrics has only $families metric families" >&2
    failed=1
  fi
  if out=$("$promtool" check metrics <"$work/$name.metrics" 2>&1); then
    echo "metrics_lint: $name: $families families, promtool check metrics: ok"
  else
    echo "metrics_lint: $name: promtool check metrics found problems:" >&2
    echo "$out" >&2
    failed=1
  fi
done
# Series an operator's alerts and dashboards need, with the labels they use.
# has NAME SAMPLE-REGEX...: the scrape of NAME has a line matching each regex.
has() {
  local name=$1 re
  shift
  for re in "$@"; do
    if ! grep -Eq "$re" "$work/$name.metrics"; then
      echo "metrics_lint: $name /metrics has no line matching: $re" >&2
      failed=1
    fi
  done
}
for name in ps worker bridge; do
  has "$name" '^process_cpu_seconds_total [0-9.e+-]+$' '^process_resident_memory_bytes [1-9]' \
    '^process_open_fds [1-9]' '^process_max_fds [1-9]' '^process_start_time_seconds [1-9]' \
    '^onlineps_build_info\{.*commit="[0-9a-z._-]+".*\} 1'
done
now=$(date +%s)
has ps '^onlineps_ps_push_staleness_count\{table="[^"]+"\} [1-9]' \
  '^onlineps_ps_clipped_pushes_total\{table=' '^onlineps_ps_dc_backup_misses_total\{table=' \
  '^onlineps_ps_checkpoints_total\{result="error"\} 0' '^onlineps_ps_checkpoint_interval_seconds 3600' \
  "^onlineps_ps_last_checkpoint_success_timestamp_seconds (${now:0:8}|$((${now:0:8} - 1)))"
has worker '^onlineps_worker_request_duration_seconds_count\{op="learn"\} [1-9]' \
  '^onlineps_worker_request_duration_seconds_count\{op="infer"\} [1-9]' \
  '^onlineps_worker_request_duration_seconds_bucket\{op="learn",le="\+Inf"\} [1-9]'
has bridge '^onlineps_bridge_http_responses_total\{code="200"\} [1-9]' \
  '^onlineps_bridge_http_responses_total\{code="401"\} 0'
# Every metric the alerts (deploy/prometheus/rules.yml) and the dashboard
# (deploy/grafana/onlineps.json) name is exported by some binary; the replica metrics
# exist only on replicated shards (tests/ps/replication tests check them).
deploy=$here/../../deploy
used=$(grep -ohE '\b(onlineps|process)_[a-z0-9_]+' "$deploy/prometheus/rules.yml" \
  "$deploy/grafana/onlineps.json" | grep -v '^onlineps_ps_replica' | sort -u)
missing=0
for m in $used; do
  if ! grep -qE "^${m}(_bucket|_count|_sum)?[{ ]" "$work"/*.metrics; then
    echo "metrics_lint: $m is used by rules.yml or the dashboard but no binary exports it" >&2
    missing=1
  fi
done
if [ "$missing" = 0 ]; then
  echo "metrics_lint: the $(echo "$used" | wc -w) metrics named by rules.yml and the dashboard are exported"
else
  failed=1
fi
[ "$failed" = 0 ] && echo "metrics_lint: process_*, build_info commit, staleness by table, checkpoint age, worker latency and bridge status series present"

# Readiness follows dependencies while liveness does not: without its shard a worker turns
# not ready, and without a healthy worker so does the bridge.
# wait_status URL CODE: whether URL answers CODE within 15 s.
wait_status() {
  for _ in $(seq 150); do
    [ "$(curl -s -o /dev/null -w '%{http_code}' "$1")" = "$2" ] && return 0
    sleep 0.1
  done
  return 1
}
kill -KILL "${pids[0]}"  # the PS shard
if ! wait_status "http://127.0.0.1:$worker_admin/readyz" 503; then
  echo "metrics_lint: worker /readyz stayed ready with its shard gone" >&2
  failed=1
fi
if [ "$(curl -s -o /dev/null -w '%{http_code}' "http://127.0.0.1:$worker_admin/livez")" != 200 ]; then
  echo "metrics_lint: worker /livez failed with its shard gone (liveness must not check peers)" >&2
  failed=1
fi
kill -KILL "${pids[1]}"  # the worker
if ! wait_status "http://$bridge_admin/readyz" 503; then
  echo "metrics_lint: bridge /readyz stayed ready with no worker" >&2
  failed=1
fi
[ "$failed" = 0 ] && echo "metrics_lint: readiness follows the shard and the worker; liveness does not"
exit "$failed"
