#!/usr/bin/env bash
# Runs the base kustomization (deploy/k8s/base: 2 shards, 2 workers, the bridge) as podman
# pods from the images of deploy/docker/, and checks what a cluster would: the probes,
# an MCP learn/infer through the bridge, a shard killed with SIGKILL and restored from
# its checkpoint volume, and the SIGTERM drains. With --overlay replicated it runs
# deploy/k8s/overlays/replicated instead (3 etcd members, 2 shards x 2 replicas, CURVE,
# workers, bridge) and checks a failover: shard 0's primary SIGKILLed, the backup takes
# over, learn/infer go on with the learned state, the killed replica rejoins in sync.
# With --overlay bridge-state it runs deploy/k8s/overlays/bridge-state (the base with the
# bridge's sessions on a volume claim) through the base's checks, and replaces the bridge
# pod on the same volume: the new bridge must serve the old MCP session id.
# An on-demand CI job (deploy/README.md, "Pod test"), not part of ctest or .ci/run: it
# builds images (~20 min on 2 cores) and needs root, podman and the Debian archive.
#
# Usage: deploy/test/run_pods.sh [options]
#   --overlay NAME   base (default), bridge-state, or replicated (needs etcd-server on
#                    the host: its etcd stands in for the etcd image, see deploy/README.md)
#   --prebuilt DIR   images from the binaries in DIR (a bookworm host build, e.g. build/bin)
#                    instead of compiling in the image build (saves the ~15 min compile)
#   --no-build       use the images already in podman's storage
#   --base IMAGE     base of the images (default localhost/onlineps-base:bookworm, made by
#                    deploy/docker/make-base.sh when missing; debian:bookworm-slim needs
#                    Docker Hub)
#   --keep           leave the (stopped) pods, volumes and network for podman logs/inspect;
#                    --cleanup removes them
#   --cleanup        remove the pods, network and volumes of an earlier --keep run, exit
# Every pod gets its container's exact args and environment from the render
# (deploy/test/podspec.py), its user, read-only root, dropped capabilities, tmpfs for
# emptyDirs, a named volume per StatefulSet claim and per PersistentVolumeClaim, the
# tokens Secret (and, replicated, the CURVE Secrets of make-curve-secrets.sh) as
# read-only mounts, and the DNS names of its StatefulSet and Services as network aliases
# on a podman network. podman cannot do the rest of Kubernetes; see deploy/README.md.
set -euo pipefail

root=$(cd "$(dirname "$0")/../.." && pwd)
prebuilt="" build=1 keep=0 cleanup_only=0 overlay=base etcd_bin=""
base=localhost/onlineps-base:bookworm
while (($#)); do
  case $1 in
    --overlay) overlay=${2:-}; shift 2 ;;
    --prebuilt) prebuilt=$(cd "$2" && pwd); shift 2 ;;
    --no-build) build=0; shift ;;
    --base) base=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    --cleanup) cleanup_only=1; shift ;;
    -h | --help) sed -n '2,32p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "run_pods: unknown argument '$1' (--help)" >&2; exit 2 ;;
  esac
done

say() { echo "run_pods: $*"; }
die() { echo "run_pods: FAIL: $*" >&2; exit 1; }
for tool in podman kubectl python3 curl jq; do
  command -v "$tool" >/dev/null || die "needs $tool (apt-get install podman kubectl python3-yaml curl jq)"
done
[ "$(id -u)" -eq 0 ] || die "needs root (rootful podman: pod networking and volume ownership)"
case $overlay in
  base) kdir=$root/deploy/k8s/base ;;
  bridge-state) kdir=$root/deploy/k8s/overlays/bridge-state ;;
  replicated)
    kdir=$root/deploy/k8s/overlays/replicated
    # The etcd image (gcr.io/etcd-development/etcd) is not pulled: no registry but the
    # Debian archive here. The host's etcd (Debian etcd-server 3.4, the one the tests use)
    # runs in the base image instead, with the manifest's command, env and probes
    # (etcdctl beside it, as in the image).
    etcd_bin=$(command -v etcd) || die "--overlay replicated needs etcd-server (apt-get install etcd-server)"
    ;;
  *) die "--overlay '$overlay': base, bridge-state or replicated (the others need a GPU or differ only in settings)" ;;
esac

# podman settings that work on a cgroup v1/v2 hybrid host without systemd (this CI
# machine): crun refuses hybrid cgroups ("cgroups in hybrid mode not supported"), runc
# runs there; podman's default ulimits (nofile 1048576, nproc 4194304) are above the
# host's hard limits and fail at container start with "setrlimit ...: Operation not
# permitted", so the containers get the host's. The host's own containers.conf is not
# touched: CONTAINERS_CONF points at this one for podman calls of this script.
work=$(mktemp -d /tmp/onlineps-pods.XXXXXX)
nofile=$(ulimit -Hn) nproc=$(ulimit -Hu)
[ "$nofile" = unlimited ] && nofile=1048576
{ [ "$nproc" = unlimited ] || [ "$nproc" -gt 32768 ]; } && nproc=32768  # podman caps itself there
{
  echo '[containers]'
  echo "default_ulimits = [\"nofile=$nofile:$nofile\", \"nproc=$nproc:$nproc\"]"
  echo '[engine]'
  echo 'cgroup_manager = "cgroupfs"'
  if command -v runc >/dev/null; then echo 'runtime = "runc"'; fi
} >"$work/containers.conf"
export CONTAINERS_CONF=$work/containers.conf

net=onlineps-test
label=io.onlineps.test=run_pods
pods=()

cleanup() {
  local rc=$?
  if [ "$keep" -eq 1 ] && [ "$cleanup_only" -eq 0 ]; then
    say "--keep: pods, volumes and network left (podman pod ps; remove with $0 --cleanup)"
  else
    podman pod ls -q --filter "label=$label" | xargs -r podman pod rm -f -t 0 >/dev/null 2>&1 || true
    podman volume ls -q --filter "label=$label" | xargs -r podman volume rm -f >/dev/null 2>&1 || true
    podman network rm -f "$net" >/dev/null 2>&1 || true
  fi
  rm -rf "$work"
  exit "$rc"
}
trap cleanup EXIT
if [ "$cleanup_only" -eq 1 ]; then
  say "removing the pods, volumes and network of an earlier run"
  exit 0
fi
podman pod ls -q --filter "label=$label" | xargs -r podman pod rm -f -t 0 >/dev/null 2>&1 || true
podman volume ls -q --filter "label=$label" | xargs -r podman volume rm -f >/dev/null 2>&1 || true

# --- images --------------------------------------------------------------------------------
slim=localhost/onlineps:0.1.0 worker=localhost/onlineps-worker:0.1.0
build_image() {  # TAG DOCKERFILE BINARIES...
  local tag=$1 name=$2 dockerfile=$root/deploy/docker/$2 started=$SECONDS
  shift 2
  local args=(--build-arg "BASE=$base" --build-arg "JOBS=${ONLINEPS_JOBS:-0}" -t "$tag"
    --build-arg "ONLINEPS_COMMIT=$(git -C "$root" rev-parse --short=12 HEAD 2>/dev/null || echo unknown)")
  if [ -n "$prebuilt" ]; then
    # A context of just the stripped binaries and a copy of the Dockerfile (podman 4.3
    # applies the <Dockerfile>.dockerignore next to it, the checkout's allowlist, even
    # with --ignorefile); the build stage is skipped.
    local ctx=$work/context-$name
    mkdir -p "$ctx/prebuilt"
    cp "$dockerfile" "$ctx/Dockerfile"
    for b in "$@"; do
      [ -x "$prebuilt/$b" ] || die "--prebuilt: no $prebuilt/$b"
      strip --strip-unneeded -o "$ctx/prebuilt/$b" "$prebuilt/$b"
    done
    say "building $tag from $prebuilt (--target prebuilt)"
    nice -n 19 podman build -f "$ctx/Dockerfile" "${args[@]}" --target prebuilt "$ctx" \
      >"$work/build.log" 2>&1 ||
      { tail -n 30 "$work/build.log" >&2; die "podman build of $tag"; }
  else
    say "building $tag from the checkout ($name; compiles, ~5 min slim, ~15 min worker on 2 cores)"
    nice -n 19 podman build -f "$dockerfile" "${args[@]}" --ignorefile "$dockerfile.dockerignore" "$root" \
      >"$work/build.log" 2>&1 || { tail -n 30 "$work/build.log" >&2; die "podman build of $tag"; }
  fi
  say "  built $tag in $((SECONDS - started)) s: $(podman image ls --format '{{.Size}}' "$tag")"
}
if [ "$build" -eq 1 ]; then
  if ! podman image exists "$base"; then
    if [ "$base" = localhost/onlineps-base:bookworm ]; then
      say "making the base image $base (mmdebstrap)"
      "$root/deploy/docker/make-base.sh" --tag "$base" >/dev/null
    fi
  fi
  build_image "$slim" Dockerfile onlineps_ps onlineps_ps_cli onlineps_worker_cli onlineps_mcp_bridge
  build_image "$worker" Dockerfile.worker onlineps_worker onlineps_worker_cli
fi
images=("$slim" "$worker")
if [ "$overlay" = replicated ]; then images+=("$base"); fi  # the etcd stand-in runs in it
for image in "${images[@]}"; do
  podman image exists "$image" || die "no image $image (run without --no-build)"
done

# --- the render ------------------------------------------------------------------------------
kubectl kustomize "$kdir" >"$work/render.yaml"
if [ "$overlay" = replicated ]; then
  # The CURVE Secrets, as the README makes them (make-curve-secrets.sh), with the slim
  # image's onlineps_ps_cli for curve-keygen (the key directory mounted at its own path).
  cat >"$work/onlineps_ps_cli" <<EOF
#!/bin/sh
d=\$(dirname "\$2")
exec podman run --rm --network none --user 0 -v "\$d:\$d" --entrypoint /usr/local/bin/onlineps_ps_cli $slim "\$@"
EOF
  chmod 0755 "$work/onlineps_ps_cli"
  ONLINEPS_PS_CLI=$work/onlineps_ps_cli "$root/deploy/k8s/make-curve-secrets.sh" -o "$work/curve-secrets.yaml" 2>"$work/out" ||
    { cat "$work/out" >&2; die "make-curve-secrets.sh"; }
  cat "$work/curve-secrets.yaml" >>"$work/render.yaml"
fi
python3 "$root/deploy/test/podspec.py" "$work/render.yaml" "$work/pods"
mapfile -t pod_lines <"$work/pods/pods"
say "render of ${kdir#"$root"/}: ${#pod_lines[@]} pods: $(cut -d' ' -f1 "$work/pods/pods" | tr '\n' ' ')"

# The Secret onlineps-mcp-tokens (created out of band, like the CURVE ones): a token of
# this run. podspec.py wrote the Secrets of the render (the CURVE ones) beside it.
token=run-pods-$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
secrets_dir=$work/pods/secrets
mkdir -p "$secrets_dir/onlineps-mcp-tokens"
echo "run-pods $token" >"$secrets_dir/onlineps-mcp-tokens/tokens"
chgrp -R 10001 "$secrets_dir"           # fsGroup 10001, defaultMode 0440
chmod 0750 "$work" "$work/pods" "$secrets_dir" "$secrets_dir"/*
chmod 0440 "$secrets_dir"/*/*

podman network exists "$net" || podman network create --label "$label" "$net" >/dev/null

k8s_size() {  # 64Mi -> 64m, 4Gi -> 4g (podman's units are powers of 1024 too)
  local v=$1
  case $v in *Ki) echo "${v%Ki}k" ;; *Mi) echo "${v%Mi}m" ;; *Gi) echo "${v%Gi}g" ;; *) echo "$v" ;; esac
}
k8s_cpus() { case $1 in *m) echo "$((${1%m} / 1000)).$(printf '%03d' $((${1%m} % 1000)))" ;; *) echo "$1" ;; esac; }

# What spec.sh sets (podspec.py), for one pod at a time.
image="" command_set=0 aliases=() admin_port="" grace=30 prestop=() run_as="" read_only=0
drop_all=0 cpu_limit="" memory_limit="" tmpfs=() claims=() secrets=()
startupProbe_path="" startupProbe_port="" startupProbe_period=10 startupProbe_failures=3
livenessProbe_path="" readinessProbe_path=""
spec() {  # POD: load the pod's spec.sh into this shell
  livenessProbe_path="" readinessProbe_path="" prestop=() tmpfs=() claims=() secrets=()
  # shellcheck source=/dev/null
  source "$work/pods/$1/spec.sh"
}
ctr() { echo "$1-c"; }  # the container of pod $1

start_pod() {  # POD
  local pod=$1 a m
  spec "$pod"
  local popts=(--name "$pod" --hostname "$pod" --network "$net" --label "$label")
  for a in "${aliases[@]}"; do popts+=(--network-alias "$a"); done
  podman pod create "${popts[@]}" >/dev/null
  local copts=(-d --pod "$pod" --name "$(ctr "$pod")" --env-file "$work/pods/$pod/env"
    --user "$run_as" --security-opt no-new-privileges --stop-timeout "$grace")
  [ "$read_only" -eq 1 ] && copts+=(--read-only)
  [ "$drop_all" -eq 1 ] && copts+=(--cap-drop ALL)
  [ -n "$memory_limit" ] && copts+=(--memory "$(k8s_size "$memory_limit")")
  [ -n "$cpu_limit" ] && copts+=(--cpus "$(k8s_cpus "$cpu_limit")")
  for m in "${tmpfs[@]}"; do copts+=(--tmpfs "${m%%:*}:rw,nosuid,nodev,mode=1777,size=$(k8s_size "${m#*:}")"); done
  for m in "${claims[@]}"; do
    podman volume exists "onlineps-test-${m%%:*}" ||
      podman volume create --label "$label" "onlineps-test-${m%%:*}" >/dev/null
    copts+=(-v "onlineps-test-${m%%:*}:${m#*:}:U")  # :U like fsGroup: the volume is the user's
  done
  for m in "${secrets[@]}"; do
    [ -d "$secrets_dir/${m%%:*}" ] || die "$pod mounts Secret ${m%%:*}, which this test does not make"
    copts+=(-v "$secrets_dir/${m%%:*}:${m#*:}:ro")
  done
  case $image in
    gcr.io/etcd-development/etcd:*)
      # Stand-in for the etcd image (not pulled here): the host's etcd binary, mounted
      # where the image has it, in the base image; same command, env, user and probes.
      image=$base
      copts+=(-v "$etcd_bin:/usr/local/bin/etcd:ro" -v "$(dirname "$etcd_bin")/etcdctl:/usr/local/bin/etcdctl:ro")
      ;;
  esac
  local argv
  mapfile -d '' -t argv <"$work/pods/$pod/argv"
  if [ "$command_set" -eq 1 ]; then
    podman run "${copts[@]}" --entrypoint "${argv[0]}" "$image" "${argv[@]:1}" >/dev/null
  else
    podman run "${copts[@]}" "$image" "${argv[@]}" >/dev/null
  fi
}

pod_ip() { podman inspect -f "{{(index .NetworkSettings.Networks \"$net\").IPAddress}}" "$(ctr "$1")"; }
http_code() { curl -s -o /dev/null -m 3 -w '%{http_code}' "$@" || true; }
show_logs() {  # POD [LINES]
  echo "--- last ${2:-30} log lines of $1 ($(podman inspect -f '{{.State.Status}} exit {{.State.ExitCode}}' "$(ctr "$1")" 2>&1)):" >&2
  podman logs --tail "${2:-30}" "$(ctr "$1")" 2>&1 | sed 's/^/    /' >&2
}
fail_pod() { show_logs "$1"; die "$1: $2"; }

wait_startup() {  # POD: the startup probe, with the kubelet's budget (period x failureThreshold)
  local pod=$1 ip deadline
  spec "$pod"
  deadline=$((SECONDS + startupProbe_period * startupProbe_failures))
  while :; do
    [ "$(podman inspect -f '{{.State.Running}}' "$(ctr "$pod")")" = true ] || fail_pod "$pod" "exited during start-up"
    ip=$(pod_ip "$pod")
    [ "$(http_code "http://$ip:$startupProbe_port$startupProbe_path")" = 200 ] && return 0
    [ "$SECONDS" -lt "$deadline" ] || fail_pod "$pod" "startup probe $startupProbe_path not 200 in $((startupProbe_period * startupProbe_failures)) s"
    sleep 1
  done
}

check_probes() {  # POD: liveness and readiness (onlineps: /livez /readyz, and /healthz) 200
  local pod=$1 ip path code deadline=$((SECONDS + 60)) paths
  spec "$pod"
  ip=$(pod_ip "$pod")
  paths=("$livenessProbe_path" "$readinessProbe_path")
  case $image in gcr.io/etcd-development/*) ;; *) paths+=(/healthz) ;; esac
  for path in "${paths[@]}"; do
    # Readiness may follow start-up by a few seconds (the bridge finds its workers by DNS
    # every 5 s); the kubelet keeps asking, so does this, for up to a minute.
    until code=$(http_code "http://$ip:$admin_port$path") && [ "$code" = 200 ]; do
      [ "$SECONDS" -lt "$deadline" ] || fail_pod "$pod" "GET $path on admin port $admin_port: $code, not 200"
      sleep 1
    done
  done
}

# --- start every pod (Parallel, like the StatefulSet and the Deployments) --------------------
started=$SECONDS
for line in "${pod_lines[@]}"; do start_pod "${line%% *}"; pods+=("${line%% *}"); done
say "started ${#pods[@]} pods on podman network $net"
for pod in "${pods[@]}"; do wait_startup "$pod"; done
say "every startup probe passed after $((SECONDS - started)) s"
for pod in "${pods[@]}"; do check_probes "$pod"; done
say "/livez /readyz /healthz 200 on every pod's admin port$([ "$overlay" != replicated ] || echo " (etcd: its liveness and readiness /health)")"

# --- MCP through the bridge, as a client of the Service onlineps-mcp-bridge -------------------
bridge=$(grep ' mcp-bridge$' "$work/pods/pods" | head -n 1 | cut -d' ' -f1)
bridge_url="http://$(pod_ip "$bridge"):8080/mcp"
hdr=(-H 'Content-Type: application/json' -H 'Accept: application/json, text/event-stream'
  -H 'Host: onlineps-mcp-bridge:8080' -H "Authorization: Bearer $token")
mcp_post() {  # BODY: the JSON-RPC reply (plain JSON or the data: line of an SSE stream)
  curl -sS -m 60 "${hdr[@]}" -H "Mcp-Session-Id: $sid" "$bridge_url" -d "$1" |
    sed -n 's/^data: //p; /^{/p' | tail -n 1
}
sid=$(curl -sS -m 10 -D - -o /dev/null "${hdr[@]}" "$bridge_url" -d '{"jsonrpc":"2.0","id":0,"method":"initialize",
  "params":{"protocolVersion":"2025-11-25","capabilities":{},"clientInfo":{"name":"run_pods","version":"1"}}}' |
  tr -d '\r' | awk -F': ' 'tolower($1)=="mcp-session-id"{print $2}')
[ -n "$sid" ] || fail_pod "$bridge" "MCP initialize gave no Mcp-Session-Id"
mcp_post '{"jsonrpc":"2.0","method":"notifications/initialized"}' >/dev/null
tool() {  # NAME ARGUMENTS_JSON: the result's structuredContent, or fail
  local reply
  reply=$(mcp_post "{\"jsonrpc\":\"2.0\",\"id\":1,\"method\":\"tools/call\",\"params\":{\"name\":\"$1\",\"arguments\":$2}}")
  if ! jq -e '.result and (.result.isError | not)' >/dev/null 2>&1 <<<"$reply"; then
    echo "run_pods: tools/call $1 $2 answered: $reply" >&2
    return 1
  fi
  jq -c '.result.structuredContent' <<<"$reply"
}
learn_all() {
  for _ in 1 2 3; do
    tool learn '{"text":"good great fine","label":"positive"}' >/dev/null || return 1
    tool learn '{"text":"bad awful poor","label":"negative"}' >/dev/null || return 1
  done
}
infer_label() { tool infer "{\"text\":\"$1\"}" | jq -r '.label'; }
learn_all || fail_pod "$bridge" "MCP learn through the bridge"
good=$(infer_label good) || fail_pod "$bridge" "MCP infer through the bridge"
awful=$(infer_label awful) || fail_pod "$bridge" "MCP infer through the bridge"
if [ "$good" != positive ] || [ "$awful" != negative ]; then
  fail_pod "$bridge" "infer after learning: good -> $good, awful -> $awful"
fi
say "MCP initialize, 6 learn calls and infer through the bridge: good -> positive, awful -> negative"

# --- the shards as onlineps_ps_cli sees them --------------------------------------------------
mapfile -t ps_pods < <(grep ' ps$' "$work/pods/pods" | cut -d' ' -f1)
ps0=${ps_pods[0]} ps1=${ps_pods[1]}
cli_pod=$ps1
if [ "$overlay" = replicated ]; then
  # Replicas per shard (the pod annotation, given to the start script by the downward API).
  R=$(sed -n 's/^PS_REPLICAS_PER_SHARD=//p' "$work/pods/$ps0/env")
  cli_pod=${ps_pods[R]}  # a replica of shard 1: shard 0's are killed below
fi
# The pod's own environment, as `kubectl exec` gives it: with CURVE the PS container has
# its certificate (which the shards admit) and their public key (ONLINEPS_CURVE_SERVER_KEY,
# read by the CLI only; components/curve).
cli() { podman exec "$(ctr "$cli_pod")" /usr/local/bin/onlineps_ps_cli --log-level warn "$@"; }
state() {  # the model as the shards hold it: rows and versions per shard, the dense values
  cli info --table text/embed | grep -oE '^shard [0-9]+|(elements|rows|version)=[0-9]+' &&
    cli pull --table text/out.weight && cli pull --table text/out.bias
}

if [ "$overlay" != replicated ]; then
  # --- SIGKILL a shard; the StatefulSet's replacement restores it from its volume ------------
  podman exec "$(ctr "$ps0")" /usr/local/bin/onlineps_ps_cli checkpoint >"$work/out" 2>&1 ||
    { cat "$work/out" >&2; fail_pod "$ps0" "onlineps_ps_cli checkpoint (kubectl exec in the README)"; }
  state >"$work/before" 2>&1 || { cat "$work/before" >&2; fail_pod "$ps1" "onlineps_ps_cli info/pull"; }
  grep -q 'rows=[1-9]' "$work/before" || { cat "$work/before" >&2; die "text/embed has no rows after learning"; }
  podman kill -s KILL "$(ctr "$ps0")" >/dev/null
  podman wait "$(ctr "$ps0")" >/dev/null || true
  code=$(podman inspect -f '{{.State.ExitCode}}' "$(ctr "$ps0")")
  [ "$code" = 137 ] || fail_pod "$ps0" "SIGKILL: exit code $code, expected 137"
  podman pod rm -f -t 0 "$ps0" >/dev/null
  say "$ps0 killed with SIGKILL (exit 137) after a checkpoint; starting its replacement on the same volume"
  started=$SECONDS
  start_pod "$ps0"
  wait_startup "$ps0"
  check_probes "$ps0"
  podman logs "$(ctr "$ps0")" 2>&1 | grep -q 'restored [1-9][0-9]* table(s) from' ||
    fail_pod "$ps0" "no 'restored N table(s)' in the replacement's log"
  say "$ps0 restored ($(podman logs "$(ctr "$ps0")" 2>&1 | grep -o 'restored [0-9]* table(s)' | head -n 1)), /readyz 200 after $((SECONDS - started)) s"
  state >"$work/after" 2>&1 || { cat "$work/after" >&2; fail_pod "$ps0" "onlineps_ps_cli info/pull after the restore"; }
  if ! diff -u "$work/before" "$work/after" >"$work/diff"; then
    head -n 40 "$work/diff" >&2
    fail_pod "$ps0" "tables differ from those checkpointed before the kill"
  fi
  say "tables after the restore are those checkpointed before the kill ($(wc -l <"$work/before") lines of info text/embed, pull text/out.*)"
  deadline=$((SECONDS + 60))  # workers reconnect to the new pod; the bridge retries once
  until [ "$(infer_label good 2>/dev/null)" = positive ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail_pod "$ps0" "infer 'good' after the restore is not positive"
    sleep 2
  done
  learn_all || fail_pod "$ps0" "learn after the restore (tables missing on the shard?)"
  say "infer after the restore still gives the learned label; learn works again"
fi

if [ "$overlay" = replicated ]; then
  # --- replicated shards: elections in etcd, SIGKILL of a primary, rejoin ----------------------
  metric() {  # POD SERIES: the value of SERIES on the pod's /metrics (empty if not there)
    local ip
    spec "$1"
    ip=$(pod_ip "$1" 2>/dev/null) && [ -n "$ip" ] || return 0
    curl -s -m 2 "http://$ip:$admin_port/metrics" 2>/dev/null |
      awk -v s="$2" 'substr($0, 1, length(s) + 1) == s " " { print $2 + 0; exit }' || true
  }
  m_primary='onlineps_ps_replica{field="primary"}' m_isr='onlineps_ps_replica{field="isr_size"}'
  m_insync='onlineps_ps_replica{field="in_sync_backups"}' m_lsn='onlineps_ps_replica{field="lsn"}'
  now_ms() { date +%s%3N; }
  shard_primary() {  # SHARD: the one replica of the shard that reports itself primary
    local i pod found=""
    for ((i = 0; i < R; i++)); do
      pod=${ps_pods[$1 * R + i]}
      if [ "$(metric "$pod" "$m_primary")" = 1 ]; then
        [ -z "$found" ] || return 1
        found=$pod
      fi
    done
    [ -n "$found" ] && echo "$found"
  }
  wait_in_sync() {  # SHARD SECONDS: one primary, every replica in its ISR; prints the primary
    local p deadline=$((SECONDS + $2))
    until p=$(shard_primary "$1") && [ "$(metric "$p" "$m_isr")" = "$R" ] &&
      [ "$(metric "$p" "$m_insync")" = "$((R - 1))" ]; do
      [ "$SECONDS" -lt "$deadline" ] || return 1
      sleep 0.5
    done
    echo "$p"
  }
  shards=$((${#ps_pods[@]} / R))
  for ((s = 0; s < shards; s++)); do
    p=$(wait_in_sync "$s" 60) || { for q in "${ps_pods[@]:s*R:R}"; do show_logs "$q" 15; done
      die "shard $s: no primary with all $R replicas in sync within 60 s"; }
    say "shard $s: primary $p, isr_size $R (in_sync_backups $((R - 1))) on its /metrics"
  done
  etcd_pod=$(grep ' etcd$' "$work/pods/pods" | head -n 1 | cut -d' ' -f1)
  prefix=$(sed -n 's/^ONLINEPS_ETCD_PREFIX=//p' "$work/pods/$ps0/env")
  # etcdctl in the etcd pod, as the README's `kubectl exec onlineps-etcd-0 -- etcdctl ...`
  if keys=$(podman exec -e ETCDCTL_API=3 "$(ctr "$etcd_pod")" /usr/local/bin/etcdctl get --prefix --keys-only "$prefix" 2>&1); then
    say "etcd keys under $prefix: $(grep -c . <<<"$keys") ($(grep -v '^$' <<<"$keys" | sed "s|^$prefix/||" | tr '\n' ' '))"
  else
    echo "$keys" >&2
    die "etcdctl get --prefix $prefix on $etcd_pod"
  fi

  state >"$work/before" 2>&1 || { cat "$work/before" >&2; fail_pod "$cli_pod" "onlineps_ps_cli info/pull"; }
  grep -q 'rows=[1-9]' "$work/before" || { cat "$work/before" >&2; die "text/embed has no rows after learning"; }
  old=$(shard_primary 0) || die "shard 0 has no single primary"
  for q in "${ps_pods[@]:0:R}"; do [ "$q" = "$old" ] || backup=$q; done
  podman kill -s KILL "$(ctr "$old")" >/dev/null
  killed_ms=$(now_ms)
  podman wait "$(ctr "$old")" >/dev/null || true
  code=$(podman inspect -f '{{.State.ExitCode}}' "$(ctr "$old")")
  [ "$code" = 137 ] || fail_pod "$old" "SIGKILL: exit code $code, expected 137"
  until [ "$(metric "$backup" "$m_primary")" = 1 ]; do
    [ $(($(now_ms) - killed_ms)) -lt 30000 ] || fail_pod "$backup" "not primary 30 s after $old was SIGKILLed"
    sleep 0.1
  done
  took_over=$(($(now_ms) - killed_ms))
  until [ "$(infer_label good 2>/dev/null)" = positive ]; do
    [ $(($(now_ms) - killed_ms)) -lt 60000 ] || fail_pod "$backup" "infer 'good' is not positive 60 s after the failover"
    sleep 0.2
  done
  served=$(($(now_ms) - killed_ms))
  say "$old (shard 0's primary) SIGKILLed (exit 137): $backup primary on its /metrics after" \
    "$((took_over / 1000)).$(printf '%03d' $((took_over % 1000))) s (lease $(sed -n 's/^ONLINEPS_REPLICA_LEASE_MS=//p' "$work/pods/$ps0/env") ms," \
    "metrics refreshed every 1 s); MCP infer gives the learned label after $((served / 1000)).$(printf '%03d' $((served % 1000))) s"
  state >"$work/after" 2>&1 || { cat "$work/after" >&2; fail_pod "$backup" "onlineps_ps_cli info/pull after the failover"; }
  # Every acknowledged push was on the backup (sync replication, both in the ISR): no
  # version or row count may go back; nothing was pushed in between, so expect the same.
  paste -d' ' <(grep -oE '(rows|version)=[0-9]+' "$work/before") <(grep -oE '(rows|version)=[0-9]+' "$work/after") |
    awk -F'[= ]' '$1 != $3 || $4 < $2 { bad = 1; print "  " $0 } END { exit bad }' >"$work/diff" ||
    { cat "$work/diff" >&2; fail_pod "$backup" "text/embed went back after the failover (before -> after)"; }
  if diff -u "$work/before" "$work/after" >"$work/diff"; then
    say "tables after the failover are those before the kill (versions, rows, text/out.* values)"
  else
    say "tables after the failover moved on, none went back: $(grep -c '^+[^+]' "$work/diff") line(s) differ"
  fi
  learn_all || fail_pod "$backup" "learn after the failover"
  if [ "$(infer_label good)" != positive ] || [ "$(infer_label awful)" != negative ]; then
    fail_pod "$backup" "infer after learning on the new primary"
  fi
  say "learn through MCP works on the new primary; infer: good -> positive, awful -> negative"

  # The StatefulSet's replacement of the killed pod, on its volume: it must come back as a
  # backup of the new primary and be taken back into the ISR.
  podman pod rm -f -t 0 "$old" >/dev/null
  started_ms=$(now_ms)
  start_pod "$old"
  wait_startup "$old"
  check_probes "$old"
  ready=$(($(now_ms) - started_ms))
  p=$(wait_in_sync 0 60) || { show_logs "$old"; show_logs "$backup"; die "$old did not rejoin shard 0's ISR within 60 s"; }
  [ "$p" = "$backup" ] || fail_pod "$old" "primary of shard 0 is $p after the rejoin, expected $backup to stay"
  rejoined=$(($(now_ms) - started_ms))
  # The bridge may have marked the workers down while the replica rejoined (seen here: both
  # workers silent for ~30 s until the primary sent the snapshot); it checks them every 5 s.
  until learn_all 2>"$work/out"; do
    [ $(($(now_ms) - started_ms)) -lt 120000 ] || { cat "$work/out" >&2; fail_pod "$backup" "learn after the rejoin"; }
    sleep 1
  done
  learned=$(($(now_ms) - started_ms))
  [ "$learned" -lt $((rejoined + 5000)) ] ||
    say "NOTE: MCP learn failed until $((learned / 1000)).$(printf '%03d' $((learned % 1000))) s after the replacement's start: $(grep -o 'learn failed[^"]*' "$work/out" | head -n 1)"
  deadline=$((SECONDS + 15))
  until [ "$(metric "$old" "$m_lsn")" = "$(metric "$backup" "$m_lsn")" ]; do
    [ "$SECONDS" -lt "$deadline" ] || fail_pod "$old" "log position $(metric "$old" "$m_lsn") not the primary's $(metric "$backup" "$m_lsn") 15 s after learning"
    sleep 0.5
  done
  say "$old restarted on its volume: backup (primary 0), isr_size $R and in_sync_backups $((R - 1)) on $backup" \
    "$((rejoined / 1000)).$(printf '%03d' $((rejoined % 1000))) s after its start (/readyz 200 after $((ready / 1000)).$(printf '%03d' $((ready % 1000))) s); after 6 more learn calls its lsn is the primary's ($(metric "$old" "$m_lsn"))"
fi

# --- SIGTERM: preStop, then SIGTERM through tini, as the kubelet stops a pod ------------------
stop_pod() {  # POD: preStop hook, SIGTERM, then SIGKILL after the grace period
  local pod=$1 code
  spec "$pod"
  if [ "${#prestop[@]}" -gt 0 ]; then podman exec "$(ctr "$pod")" "${prestop[@]}" || true; fi
  podman stop -t "$grace" "$(ctr "$pod")" >/dev/null
  code=$(podman inspect -f '{{.State.ExitCode}}' "$(ctr "$pod")")
  [ "$code" = 0 ] || fail_pod "$pod" "exit code $code after SIGTERM (expected 0: drained)"
}
if [ "$overlay" = bridge-state ]; then
  # --- the bridge's sessions on its claim: a new bridge pod (strategy Recreate: the old one
  # stops first) on the same volume serves the session of the old one ------------------------
  stop_pod "$bridge"
  podman pod rm -f -t 0 "$bridge" >/dev/null
  started=$SECONDS
  start_pod "$bridge"
  wait_startup "$bridge"
  check_probes "$bridge"
  bridge_url="http://$(pod_ip "$bridge"):8080/mcp"
  good=$(infer_label good) ||
    fail_pod "$bridge" "MCP infer on the old session ($sid) after the bridge was replaced on its state volume"
  [ "$good" = positive ] || fail_pod "$bridge" "infer after the bridge was replaced: good -> $good"
  learn_all || fail_pod "$bridge" "MCP learn on the old session after the bridge was replaced"
  say "$bridge replaced on its state volume (Ready after $((SECONDS - started)) s): the old MCP session id" \
    "goes on (infer good -> positive, learn)"
fi

# etcd last: a SIGTERMed primary hands its shard over through etcd.
mapfile -t stop_lines < <(grep -v ' etcd$' "$work/pods/pods"; grep ' etcd$' "$work/pods/pods" || true)
for line in "${stop_lines[@]}"; do
  pod=${line%% *}
  started=$SECONDS
  stop_pod "$pod"
  if [ "${line#* }" = ps ]; then
    logs=$(podman logs "$(ctr "$pod")" 2>&1 | sed -n '/signal 15: draining/,$p')
    grep -Eq 'checkpoint /var/lib/onlineps/checkpoints/shard-[0-9]+-of-[0-9]+\.ckpt(\.d[0-9]+)? \([0-9]+ bytes' <<<"$logs" ||
      fail_pod "$pod" "no final checkpoint logged after 'signal 15: draining'"
    grep -q 'shard [0-9]*/[0-9]* stopped' <<<"$logs" || fail_pod "$pod" "no 'shard i/N stopped' after the drain"
    say "$pod: SIGTERM -> drained, final checkpoint written, exit 0 ($((SECONDS - started)) s with preStop)"
  elif [ "${line#* }" = etcd ]; then
    say "$pod: SIGTERM -> exit 0 ($((SECONDS - started)) s)"
  else
    say "$pod: SIGTERM -> exit 0 ($((SECONDS - started)) s with preStop)"
  fi
done
say "PASS ($overlay, ${SECONDS} s)"
