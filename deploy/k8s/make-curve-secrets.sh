#!/usr/bin/env bash
# Makes the CurveZMQ key pairs of an onlineps cluster and prints the Kubernetes Secrets
# that deploy/k8s/components/curve mounts (onlineps-curve-ps, -worker, -bridge):
#
#   deploy/k8s/make-curve-secrets.sh | kubectl apply -f -
#   deploy/k8s/make-curve-secrets.sh --keys ./curve-keys -o curve-secrets.yaml
#
# Each Secret holds one component's own certificate (key `cert`, both keys) and the
# public keys it needs: `server.pub` (the key of the servers it connects to; the shards'
# is their own, for `kubectl exec onlineps-ps-0 -- onlineps_ps_cli`) and `allow` (the
# client keys it admits: the shards admit the workers and their own key, the workers
# admit the bridge). No secret key is shared between components and none is written to
# git. The shards' own key is on their allow list because the replicas of a replicated
# shard (components/replication) and onlineps_ps_cli in a PS pod connect with the
# shards' certificate; Secrets made before it was added refuse that, and Secrets made
# before onlineps-curve-ps had `server.pub` cannot be mounted by the PS pods: remake
# them (components/curve/kustomization.yaml shows how to add server.pub by hand).
#
# Options:
#   -n, --namespace NS  namespace of the Secrets (default onlineps)
#   -o, --output FILE   write the YAML to FILE (mode 0600; refused if it exists);
#                       without it the YAML goes to stdout, which must not be a terminal
#   --keys DIR          keep every key file in DIR (created, mode 0700; refused if it
#                       exists) and add an `ops` certificate for onlineps_ps_cli /
#                       onlineps_worker_cli from outside the cluster: the shards and the
#                       workers admit it. Without --keys the key files live in a temporary
#                       directory that is removed on exit.
# Needs kubectl (only `--dry-run=client`: no cluster is contacted) and onlineps_ps_cli
# for `curve-keygen`: $ONLINEPS_PS_CLI, else $ONLINEPS_BIN_DIR/onlineps_ps_cli, else
# onlineps_ps_cli on PATH, else the repository's build/bin.
# New keys take effect after `kubectl -n NS rollout restart statefulset/onlineps-ps
# deploy/onlineps-worker deploy/onlineps-mcp-bridge` (the binaries read them at start;
# pods with old and new keys cannot talk to each other while the rollout runs).
set -euo pipefail

usage() {
  sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'
}
die() {
  echo "make-curve-secrets: $*" >&2
  exit 2
}

namespace=onlineps
output=""
keys=""
while [ $# -gt 0 ]; do
  case $1 in
    -n | --namespace) [ $# -ge 2 ] || die "$1 needs a value"; namespace=$2; shift 2 ;;
    -o | --output) [ $# -ge 2 ] || die "$1 needs a value"; output=$2; shift 2 ;;
    --keys) [ $# -ge 2 ] || die "$1 needs a value"; keys=$2; shift 2 ;;
    -h | --help) usage; exit 0 ;;
    *) usage >&2; die "unknown argument $1" ;;
  esac
done
[[ $namespace =~ ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$ ]] || die "namespace '$namespace' is not a DNS label"
if [ -z "$output" ] && [ -t 1 ]; then
  die "refusing to print secret keys to a terminal: pipe into 'kubectl apply -f -' or use -o FILE"
fi
if [ -n "$output" ] && [ -e "$output" ]; then die "$output exists"; fi
command -v kubectl >/dev/null 2>&1 || die "kubectl is not installed"

here=$(cd "$(dirname "$0")" && pwd)
cli=${ONLINEPS_PS_CLI:-}
if [ -z "$cli" ] && [ -n "${ONLINEPS_BIN_DIR:-}" ]; then cli=$ONLINEPS_BIN_DIR/onlineps_ps_cli; fi
if [ -z "$cli" ]; then cli=$(command -v onlineps_ps_cli || true); fi
if [ -z "$cli" ]; then cli=$here/../../build/bin/onlineps_ps_cli; fi
[ -x "$cli" ] || die "onlineps_ps_cli not found ($cli): build it or set ONLINEPS_PS_CLI"

umask 077
if [ -n "$keys" ]; then
  [ -e "$keys" ] && die "$keys exists (new keys go into a new directory)"
  mkdir -p "$(dirname "$keys")"
  mkdir -m 0700 "$keys"
  dir=$(cd "$keys" && pwd)
  roles=(ps worker bridge ops)
else
  dir=$(mktemp -d "${TMPDIR:-/tmp}/onlineps-curve-keys.XXXXXX")
  trap 'rm -rf "$dir"' EXIT
  roles=(ps worker bridge)
fi

for r in "${roles[@]}"; do
  # The shell's ONLINEPS_* settings must not reach the key generation.
  if ! env -u ONLINEPS_CONFIG "$cli" curve-keygen "$dir/$r" >"$dir/keygen.log" 2>&1; then
    cat "$dir/keygen.log" >&2
    die "onlineps_ps_cli curve-keygen $dir/$r failed"
  fi
done
rm -f "$dir/keygen.log"
# Allow lists: the public keys of the clients each server admits (the shards: also their
# own, for replication between replicas).
cat "$dir/worker.pub" "$dir/ps.pub" >"$dir/ps.allow"
cat "$dir/bridge.pub" >"$dir/worker.allow"
if [ -f "$dir/ops.pub" ]; then
  cat "$dir/ops.pub" >>"$dir/ps.allow"
  cat "$dir/ops.pub" >>"$dir/worker.allow"
fi

# secret NAME COMPONENT KEY=FILE...: one Secret as YAML, with the onlineps labels.
secret() {
  local name=$1 component=$2 args=() kv
  shift 2
  for kv in "$@"; do args+=("--from-file=$kv"); done
  kubectl create secret generic "$name" --namespace "$namespace" "${args[@]}" \
    --dry-run=client -o yaml |
    kubectl label --local -f - -o yaml \
      app.kubernetes.io/name=onlineps app.kubernetes.io/instance=onlineps \
      app.kubernetes.io/component="$component" app.kubernetes.io/part-of=onlineps
}

yaml=$dir/secrets.yaml
{
  # Every document starts with ---, so the output can follow other YAML (cat render.yaml -).
  echo "# onlineps CURVE Secrets made by deploy/k8s/make-curve-secrets.sh: SECRET KEYS, never commit."
  echo "---"
  secret onlineps-curve-ps ps "cert=$dir/ps" "server.pub=$dir/ps.pub" "allow=$dir/ps.allow"
  echo "---"
  secret onlineps-curve-worker worker "cert=$dir/worker" "server.pub=$dir/ps.pub" \
    "allow=$dir/worker.allow"
  echo "---"
  secret onlineps-curve-bridge mcp-bridge "cert=$dir/bridge" "server.pub=$dir/worker.pub"
} >"$yaml"

if [ -n "$output" ]; then
  cp "$yaml" "$output"
  echo "make-curve-secrets: wrote $output (namespace $namespace)" >&2
else
  cat "$yaml"
fi
if [ -n "$keys" ]; then
  rm -f "$yaml"
  echo "make-curve-secrets: key files in $dir; from outside the cluster use" \
    "--curve-cert $dir/ops --curve-server-key $dir/ps.pub (shards) or $dir/worker.pub (workers)" >&2
fi
