#!/usr/bin/env bash
# Sets everything up, builds, and starts a local cluster on loopback: PS shards,
# libtorch workers serving the built-in `text` demo model, and the MCP bridge. Teaches
# the model a small sentiment task through MCP (scripts/mcp_demo.sh), runs a short
# asynchronous PS workload, then keeps serving MCP until Ctrl-C or SIGTERM.
#
# Usage: scripts/run_local.sh [--shards N] [--workers M] [--steps S] [--base-port P]
#                             [--mcp-port P] [--model NAME] [--optimizer NAME]
#                             [--staleness POLICY] [--replicas R] [--exit | --keep]
#   --shards N         PS shard processes, 1 to 100 (default 2)
#   --workers M        worker processes, 1 to 100 (default 2); also threads of the PS workload
#   --steps S          pushes per thread of the PS workload, 1 to 100000000 (default 300)
#   --base-port P      shard i on P+i (admin P+100+i); worker j on P+200+j (admin P+300+j);
#                      bridge admin on P+401; 1024 to 65034 (default 7000)
#   --mcp-port P       the MCP endpoint http://127.0.0.1:P/mcp, 1024 to 65535 and none of
#                      the ports above (default 7400)
#   --model NAME       text (the demo: hashed words -> sentiment) | mlp (64 features -> 10
#                      digits, sklearn's digits layout; no demo, infer takes `features`)
#   --optimizer NAME   sgd | adagrad | ftrl | adam for the model's tables (default sgd)
#   --staleness NAME   none | lr_over_tau | dc_constant | dc_adaptive for the model's tables
#                      and the PS workload (default lr_over_tau)
#   --replicas R       replicas per shard, 1 to 5 (default 1: not replicated). With 2 or
#                      more, a local etcd starts on P+500 (peer port P+501; temporary data
#                      dir) and replica r of shard i listens on P+i+20r (admin
#                      P+100+i+20r); at most 20 shards
#   --exit             stop after the demo instead of serving until Ctrl-C
#   --keep             serve until Ctrl-C or SIGTERM after the demo (the default)
# A bad value exits 2 at once, before anything is set up or started.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shards=2 workers=2 steps=300 base_port=7000 mcp_port=7400 staleness=lr_over_tau keep=1
model=text optimizer=sgd replicas=1
# usage_error MESSAGE: a bad command line, named before anything is set up or started.
usage_error() { echo "run_local: $* (see --help)" >&2; exit 2; }
while [ $# -gt 0 ]; do
  case "$1" in
    --shards|--workers|--steps|--base-port|--staleness|--model|--optimizer|--mcp-port|--replicas)
      [ $# -ge 2 ] || usage_error "$1 needs a value" ;;
  esac
  case "$1" in
    --shards) shards=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --base-port) base_port=$2; shift 2 ;;
    --staleness) staleness=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --optimizer) optimizer=$2; shift 2 ;;
    --mcp-port) mcp_port=$2; shift 2 ;;
    --replicas) replicas=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --exit) keep=0; shift ;;
    -h|--help) awk 'NR > 1 && !/^#/ { exit } NR > 1 { sub(/^# ?/, ""); print }' "$0"; exit 0 ;;
    *) echo "run_local: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
# check_int VAR FLAG MIN MAX: VAR holds a decimal integer in MIN..MAX (leading zeros are
# read as decimal, not octal); else exit 2 naming FLAG and the range.
check_int() {
  local v=${!1}
  if ! [[ "$v" =~ ^[0-9]{1,9}$ ]] || [ $((10#$v)) -lt "$3" ] || [ $((10#$v)) -gt "$4" ]; then
    usage_error "$2 must be an integer from $3 to $4, got '$v'"
  fi
  printf -v "$1" '%d' $((10#$v))
}
# The port layout gives shards and workers 100 ports each (see --base-port).
check_int shards --shards 1 100
check_int workers --workers 1 100
check_int steps --steps 1 100000000
check_int replicas --replicas 1 5
# Ports below 1024 need root; the highest derived port is P+501 (etcd's peer port).
check_int base_port --base-port 1024 65034
check_int mcp_port --mcp-port 1024 65535
if [ "$replicas" -gt 1 ] && [ "$shards" -gt 20 ]; then
  usage_error "with --replicas $replicas, --shards must be at most 20 (ports P+i+20r)," \
    "got '$shards'"
fi
# The MCP port must be none of the ports the cluster derives from --base-port.
cluster_ports() {
  local i j r
  for ((i = 0; i < shards; i++)); do
    for ((r = 0; r < replicas; r++)); do
      echo $((base_port + i + 20 * r)) $((base_port + 100 + i + 20 * r))
    done
  done
  for ((j = 0; j < workers; j++)); do echo $((base_port + 200 + j)) $((base_port + 300 + j)); done
  echo $((base_port + 401))
  if [ "$replicas" -gt 1 ]; then echo $((base_port + 500)) $((base_port + 501)); fi
}
if [[ " $(cluster_ports | tr '\n' ' ') " == *" $mcp_port "* ]]; then
  usage_error "--mcp-port $mcp_port is one of the cluster's ports" \
    "(P+$((mcp_port - base_port)) of --base-port $base_port)"
fi
case "$optimizer" in
  sgd|adagrad|ftrl|adam) ;;
  *) usage_error "--optimizer must be sgd, adagrad, ftrl or adam, got '$optimizer'" ;;
esac
case "$staleness" in
  none|lr_over_tau|dc_constant|dc_adaptive) ;;
  *) usage_error "--staleness must be none, lr_over_tau, dc_constant or dc_adaptive," \
       "got '$staleness'" ;;
esac
case "$model" in
  text) model_flags=(--model text --labels "negative,positive" --lr 1.0) ;;
  mlp) model_flags=(--model mlp --input-dim 64 --hidden 32 --labels "0,1,2,3,4,5,6,7,8,9" --lr 0.05) ;;
  *) usage_error "--model must be text or mlp, got '$model'" ;;
esac

"$root/scripts/setup.sh"
"$root/scripts/build.sh"
bin=${ONLINEPS_BUILD_DIR:-$root/build}/bin
data=$(mktemp -d /tmp/onlineps-local.XXXXXX)
pids=() names=() logs=()
etcd_pid=""
fg_pid=""
# started NAME LOG: records the process just started in the background ($!).
started() {
  pids+=("$!") names+=("$1") logs+=("$2")
}
# fail WHAT LOG: says WHAT happened, shows the end of LOG (the process's own words), and
# stops the cluster.
fail() {
  echo "run_local: $1; the last lines of $2:" >&2
  tail -n 15 "$2" | sed 's/^/    /' >&2
  exit 1
}
# Every process started so far still runs; else name the first that exited (the cause,
# e.g. "Address already in use", is at the end of its log).
check_alive() {
  local k
  for k in "${!pids[@]}"; do
    kill -0 "${pids[$k]}" 2>/dev/null || fail "${names[$k]} exited" "${logs[$k]}"
  done
}
# wait_listening K: process K prints LISTENING once bound, within 10 s.
wait_listening() {
  for _ in $(seq 100); do
    grep -q '^LISTENING' "${logs[$1]}" 2>/dev/null && return 0
    check_alive
    sleep 0.1
  done
  fail "${names[$1]} did not start listening in 10 s" "${logs[$1]}"
}
# waited CMD...: runs CMD and waits for it. CMD runs in the background so that a signal to
# this script runs its trap at once: bash runs a trap only after the foreground command
# has finished (a long PS workload would hold SIGTERM for its whole run).
waited() {
  local rc=0
  "$@" &
  fg_pid=$!
  wait "$fg_pid" || rc=$?
  fg_pid=""
  return "$rc"
}
# stop_tree PID: SIGTERM to PID, then to the processes it had started (e.g. mcp_demo.sh's
# curl), so that none outlives this script.
stop_tree() {
  local kids kid
  kids=$(pgrep -P "$1" 2>/dev/null || true)
  kill -TERM "$1" 2>/dev/null || true
  for kid in $kids; do stop_tree "$kid"; done
}
cleanup() {
  if [ -n "$fg_pid" ]; then stop_tree "$fg_pid"; wait "$fg_pid" 2>/dev/null || true; fi
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  # etcd last: stopping replicas hand their leadership over through it.
  if [ -n "$etcd_pid" ]; then kill -TERM "$etcd_pid" 2>/dev/null || true; wait "$etcd_pid" 2>/dev/null || true; fi
  echo "run_local: cluster stopped (checkpoints in $data)"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

replica_flags=()
if [ "$replicas" -gt 1 ]; then
  etcd_url="http://127.0.0.1:$((base_port + 500))"
  etcd_peer="http://127.0.0.1:$((base_port + 501))"
  etcd --name local --data-dir "$data/etcd" --listen-client-urls "$etcd_url" \
    --advertise-client-urls "$etcd_url" --listen-peer-urls "$etcd_peer" \
    --initial-advertise-peer-urls "$etcd_peer" --initial-cluster "local=$etcd_peer" \
    --logger zap --log-level error >"$data/etcd.out" 2>&1 &
  etcd_pid=$!
  for _ in $(seq 100); do
    curl -sf -X POST "$etcd_url/v3/kv/range" -d '{"key":"AA=="}' >/dev/null 2>&1 && break
    sleep 0.1
  done
  curl -sf -X POST "$etcd_url/v3/kv/range" -d '{"key":"AA=="}' >/dev/null 2>&1 ||
    fail "etcd did not start on $etcd_url" "$data/etcd.out"
  echo "run_local: etcd on $etcd_url (replica membership and elections)"
  replica_flags=(--etcd "$etcd_url" --replica-lease-ms 2000)
fi

endpoints=()
for ((i = 0; i < shards; i++)); do
  group=()
  for ((r = 0; r < replicas; r++)); do group+=("tcp://127.0.0.1:$((base_port + i + 20 * r))"); done
  for ((r = 0; r < replicas; r++)); do
    port=$((base_port + i + 20 * r))
    extra=()
    if [ "$replicas" -gt 1 ]; then
      extra=(--replicas "$(IFS=,; echo "${group[*]}")" --replica-index "$r" "${replica_flags[@]}")
    fi
    mkdir -p "$data/r$r"
    "$bin/onlineps_ps" --shard-index "$i" --num-shards "$shards" \
      --listen "tcp://127.0.0.1:$port" --admin-port $((base_port + 100 + i + 20 * r)) \
      --checkpoint-dir "$data/r$r" --log-level warn "${extra[@]}" >"$data/shard-$i-$r.out" 2>&1 &
    started "shard $i (replica $r, tcp://127.0.0.1:$port)" "$data/shard-$i-$r.out"
  done
  endpoints+=("$(IFS='|'; echo "${group[*]}")")
done
# Each shard prints LISTENING once bound: a taken port or a bad checkpoint shows here,
# with the shard's own words, not later as a worker that cannot reach it.
for k in "${!pids[@]}"; do wait_listening "$k"; done
list=$(IFS=,; echo "${endpoints[*]}")
echo "run_local: $shards shard(s) x $replicas replica(s) on $list"
for ((i = 0; i < shards; i++)); do
  echo "run_local:   shard $i metrics: http://127.0.0.1:$((base_port + 100 + i))/metrics"
done
workers_list=()
for ((j = 0; j < workers; j++)); do
  port=$((base_port + 200 + j))
  "$bin/onlineps_worker" --ps "$list" --listen "tcp://127.0.0.1:$port" \
    --admin-port $((base_port + 300 + j)) "${model_flags[@]}" --optimizer "$optimizer" \
    --staleness-policy "$staleness" --log-level warn >"$data/worker-$j.out" 2>&1 &
  started "worker $j (tcp://127.0.0.1:$port)" "$data/worker-$j.out"
  workers_list+=("tcp://127.0.0.1:$port")
done
for j in "${!workers_list[@]}"; do
  ok=0
  for _ in $(seq 100); do
    if "$bin/onlineps_worker_cli" --worker "${workers_list[$j]}" --timeout-ms 300 worker_stats \
      >/dev/null 2>&1; then ok=1; break; fi
    check_alive
    sleep 0.2
  done
  [ "$ok" = 1 ] || fail "worker $j did not answer in 20 s" "$data/worker-$j.out"
done
echo "run_local: $workers worker(s) ($model model, $optimizer, $staleness) on ${workers_list[*]}"
"$bin/onlineps_mcp_bridge" --workers "$(IFS=,; echo "${workers_list[*]}")" --port "$mcp_port" \
  --admin-port $((base_port + 401)) --log-level warn >"$data/bridge.out" 2>&1 &
started "the MCP bridge (port $mcp_port)" "$data/bridge.out"
mcp_url="http://127.0.0.1:$mcp_port/mcp"
wait_listening $((${#pids[@]} - 1))
echo "run_local: MCP bridge on $mcp_url (metrics http://127.0.0.1:$((base_port + 401))/metrics)"
if [ "$model" = text ]; then
  waited "$root/scripts/mcp_demo.sh" "$mcp_url"
else
  echo "run_local: the mlp model takes 64 features: tools/call infer {\"features\": [0, 1, ...]}"
fi

echo "run_local: asynchronous PS workload ($workers threads x $steps pushes):"
waited "$bin/onlineps_ps_cli" --shards "$list" --log-level warn demo \
  --workers "$workers" --steps "$steps" --staleness "$staleness"
echo "run_local: staleness histogram of shard 0:"
curl -s "http://127.0.0.1:$((base_port + 100))/metrics" | grep '^onlineps_ps_push_staleness' || true
if [ "$keep" = 1 ]; then
  cat <<EOT

run_local: serving MCP on $mcp_url (Streamable HTTP; tools infer, learn, set_context,
append_context, clear_context, get_context, model_info). Try it:

  npx -y --loglevel=error -p node@22 -p @modelcontextprotocol/inspector@2.12.0 -c \\
    'mcp-inspector --cli $mcp_url --transport http --method tools/call --tool-name infer --tool-arg text="a lovely film"'

or add it to an MCP client's config:

  {"mcpServers": {"onlineps": {"type": "streamable-http", "url": "$mcp_url"}}}

Ctrl-C stops the cluster, and so does kill $$ (SIGTERM to this script).
EOT
  while true; do
    sleep 3600 &
    pids+=($!)  # a background sleep ignores SIGINT: cleanup ends it
    wait $!
  done
fi
