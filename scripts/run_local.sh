#!/usr/bin/env bash
# Sets everything up, builds, and starts a local cluster on loopback: PS shards,
# libtorch workers serving the built-in `text` demo model, and the MCP bridge. Teaches
# the model a small sentiment task through MCP (scripts/mcp_demo.sh), runs a short
# asynchronous PS workload, then keeps serving MCP until Ctrl-C.
#
# Usage: scripts/run_local.sh [--shards N] [--workers M] [--steps S] [--base-port P]
#                             [--mcp-port P] [--model NAME] [--optimizer NAME]
#                             [--staleness POLICY] [--exit]
#   --shards N         PS shard processes (default 2)
#   --workers M        worker processes (default 2); also threads of the PS workload
#   --steps S          pushes per thread of the PS workload (default 300)
#   --base-port P      shard i on P+i (admin P+100+i); worker j on P+200+j (admin P+300+j);
#                      bridge admin on P+401 (default 7000)
#   --mcp-port P       the MCP endpoint http://127.0.0.1:P/mcp (default 7400)
#   --model NAME       text (the demo: hashed words -> sentiment) | mlp (64 features -> 10
#                      digits, sklearn's digits layout; no demo, infer takes `features`)
#   --optimizer NAME   sgd | adagrad | ftrl | adam for the model's tables (default sgd)
#   --staleness NAME   none | lr_over_tau | dc_constant | dc_adaptive for the model's tables
#                      and the PS workload (default lr_over_tau)
#   --exit             stop after the demo instead of serving until Ctrl-C
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
shards=2 workers=2 steps=300 base_port=7000 mcp_port=7400 staleness=lr_over_tau keep=1
model=text optimizer=sgd
while [ $# -gt 0 ]; do
  case "$1" in
    --shards) shards=$2; shift 2 ;;
    --workers) workers=$2; shift 2 ;;
    --steps) steps=$2; shift 2 ;;
    --base-port) base_port=$2; shift 2 ;;
    --staleness) staleness=$2; shift 2 ;;
    --model) model=$2; shift 2 ;;
    --optimizer) optimizer=$2; shift 2 ;;
    --mcp-port) mcp_port=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --exit) keep=0; shift ;;
    -h|--help) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_local: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
case "$model" in
  text) model_flags=(--model text --labels "negative,positive" --lr 1.0) ;;
  mlp) model_flags=(--model mlp --input-dim 64 --hidden 32 --labels "0,1,2,3,4,5,6,7,8,9" --lr 0.05) ;;
  *) echo "run_local: --model must be text or mlp, got '$model'" >&2; exit 2 ;;
esac

"$root/scripts/setup.sh"
"$root/scripts/build.sh"
bin=${ONLINEPS_BUILD_DIR:-$root/build}/bin
data=$(mktemp -d /tmp/onlineps-local.XXXXXX)
pids=()
cleanup() {
  for pid in "${pids[@]}"; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${pids[@]}"; do wait "$pid" 2>/dev/null || true; done
  echo "run_local: cluster stopped (checkpoints in $data)"
}
trap cleanup EXIT
trap 'exit 0' INT TERM

endpoints=()
for ((i = 0; i < shards; i++)); do
  port=$((base_port + i))
  "$bin/onlineps_ps" --shard-index "$i" --num-shards "$shards" \
    --listen "tcp://127.0.0.1:$port" --admin-port $((base_port + 100 + i)) \
    --checkpoint-dir "$data" --log-level warn >"$data/shard-$i.out" 2>&1 &
  pids+=($!)
  endpoints+=("tcp://127.0.0.1:$port")
done
list=$(IFS=,; echo "${endpoints[*]}")
echo "run_local: $shards shard(s) on $list"
for ((i = 0; i < shards; i++)); do
  echo "run_local:   shard $i metrics: http://127.0.0.1:$((base_port + 100 + i))/metrics"
done
workers_list=()
for ((j = 0; j < workers; j++)); do
  port=$((base_port + 200 + j))
  "$bin/onlineps_worker" --ps "$list" --listen "tcp://127.0.0.1:$port" \
    --admin-port $((base_port + 300 + j)) "${model_flags[@]}" --optimizer "$optimizer" \
    --staleness-policy "$staleness" --log-level warn >"$data/worker-$j.out" 2>&1 &
  pids+=($!)
  workers_list+=("tcp://127.0.0.1:$port")
done
for j in "${!workers_list[@]}"; do
  ok=0
  for _ in $(seq 100); do
    if "$bin/onlineps_worker_cli" --worker "${workers_list[$j]}" --timeout-ms 300 worker_stats \
      >/dev/null 2>&1; then ok=1; break; fi
    sleep 0.2
  done
  if [ "$ok" = 0 ]; then
    echo "run_local: worker $j did not come up:" >&2
    tail -5 "$data/worker-$j.out" >&2
    exit 1
  fi
done
echo "run_local: $workers worker(s) ($model model, $optimizer, $staleness) on ${workers_list[*]}"
"$bin/onlineps_mcp_bridge" --workers "$(IFS=,; echo "${workers_list[*]}")" --port "$mcp_port" \
  --admin-port $((base_port + 401)) --log-level warn >"$data/bridge.out" 2>&1 &
pids+=($!)
mcp_url="http://127.0.0.1:$mcp_port/mcp"
for _ in $(seq 100); do grep -q '^LISTENING' "$data/bridge.out" 2>/dev/null && break; sleep 0.1; done
grep -q '^LISTENING' "$data/bridge.out" || { echo "run_local: the bridge did not start:" >&2; cat "$data/bridge.out" >&2; exit 1; }
echo "run_local: MCP bridge on $mcp_url (metrics http://127.0.0.1:$((base_port + 401))/metrics)"
if [ "$model" = text ]; then
  "$root/scripts/mcp_demo.sh" "$mcp_url"
else
  echo "run_local: the mlp model takes 64 features: tools/call infer {\"features\": [0, 1, ...]}"
fi

echo "run_local: asynchronous PS workload ($workers threads x $steps pushes):"
"$bin/onlineps_ps_cli" --shards "$list" --log-level warn demo \
  --workers "$workers" --steps "$steps" --staleness "$staleness"
echo "run_local: staleness histogram of shard 0:"
curl -s "http://127.0.0.1:$((base_port + 100))/metrics" | grep '^onlineps_ps_push_staleness' || true
if [ "$keep" = 1 ]; then
  cat <<EOT

run_local: serving MCP on $mcp_url (Streamable HTTP; tools infer, learn, set_context,
append_context, clear_context, get_context, model_info). Try it:

  npx -y -p node@22 -p @modelcontextprotocol/inspector@2.12.0 -c \\
    'mcp-inspector --cli $mcp_url --transport http --method tools/call --tool-name infer --tool-arg text="a lovely film"'

or add it to an MCP client's config:

  {"mcpServers": {"onlineps": {"type": "streamable-http", "url": "$mcp_url"}}}

Ctrl-C stops the cluster.
EOT
  while true; do
    sleep 3600 &
    pids+=($!)  # a background sleep ignores SIGINT: cleanup ends it
    wait $!
  done
fi
