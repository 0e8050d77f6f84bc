#!/usr/bin/env bash
# Offline checks of deploy/ (no cluster, no container engine):
#   1. yamllint over deploy/ (deploy/.yamllint.yaml)
#   2. kubectl kustomize of the base and every overlay, then each rendered object against
#      the Kubernetes schemas (deploy/validate/validate.mjs, kubernetes-models) and the
#      onlineps structure rules (deploy/validate/checks.mjs: probes, headless Services,
#      shard list = replicas, GPU settings, files from Secrets, CURVE wiring, replicated
#      shards, etcd, ...); for the curve and replicated overlays also: checks.mjs refuses
#      broken variants (checks_test.mjs), the Secrets of deploy/k8s/make-curve-secrets.sh
#      fit them (needs onlineps_ps_cli), and no CURVE secret key is committed under deploy/
#   3. promtool: check config (Kubernetes discovery checked by promconfig.mjs, since
#      Debian's promtool has none), check rules, test rules; and prometheus.yml's
#      relabeling gives every PS pod of every render its job, pod and shard labels
#      (promshards.mjs: the replication alerts group by shard)
#   4. shellcheck over scripts/, tests/, deploy/ and .ci/run
#   5. dockerfilelint over deploy/docker/Dockerfile*, plus the image conventions
#      (tini exec-form ENTRYPOINT, numeric non-root USER, EXPOSE of the manifests' ports,
#      every FROM a stage or a pinned image)
#   6. with the built binaries: every ONLINEPS_* name the manifests set is one the
#      binaries read (from their --help), and each container's exact command line (start
#      script included) runs with the pod environment of every StatefulSet pod into the
#      binary's `--print-config` (parses and exits without serving), which must show the
#      pod's shard (and replica) index; the start scripts refuse a missing or foreign
#      pod-index label and a pod past NUM_SHARDS x R (deploy/validate/podenv.mjs)
# Every check runs; the script prints each failure and exits 1 if any failed. A missing
# tool is a failure naming what to install.
# Usage: tests/system/deploy_lint.sh
#   ONLINEPS_DEPLOY_DIR  deploy folder to check (default: the repository's deploy/)
#   PROMTOOL             promtool (default: build/tools/prom/usr/bin/promtool, then PATH)
#   ONLINEPS_BIN_DIR     the binaries for step 6 (default build/bin; when it is not set and
#                        build/bin has no binaries, step 6 is skipped with a note)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
deploy=$(cd "${ONLINEPS_DEPLOY_DIR:-$root/deploy}" && pwd)
validate=$deploy/validate

work=$(mktemp -d /tmp/onlineps-deploy-lint.XXXXXX)
trap 'rm -rf "$work"' EXIT

passed=0
failed=0
ok() {
  echo "deploy_lint: ok: $1"
  passed=$((passed + 1))
}
bad() {
  echo "deploy_lint: FAILED: $1" >&2
  failed=$((failed + 1))
}
# check NAME CMD...: runs CMD, shows its output only when it fails.
check() {
  local name=$1
  shift
  if "$@" >"$work/out" 2>&1; then
    ok "$name"
  else
    bad "$name"
    sed 's/^/    /' "$work/out" >&2
  fi
}

# --- tools -------------------------------------------------------------------------
missing=()
need() {  # need COMMAND HOW-TO-INSTALL
  if ! command -v "$1" >/dev/null 2>&1; then missing+=("$1 is not installed: $2"); fi
}
need kubectl "install kubectl >= 1.27 (kustomize v5); Debian's kubernetes-client (1.20) is too old"
need yamllint "apt-get install yamllint (Debian package; scripts/setup.sh should list it)"
need shellcheck "apt-get install shellcheck (Debian package; scripts/setup.sh should list it)"
need node "apt-get install nodejs npm (Node >= 18)"
need npm "apt-get install npm"
promtool=${PROMTOOL:-$root/build/tools/prom/usr/bin/promtool}
if [ ! -x "$promtool" ]; then promtool=$(command -v promtool || true); fi
if [ -z "$promtool" ]; then
  missing+=("promtool not found: run scripts/setup.sh (it unpacks Debian's prometheus package into build/tools/prom) or set PROMTOOL")
fi
if [ ${#missing[@]} -eq 0 ]; then
  kubectl_minor=$(kubectl version --client -o json 2>/dev/null |
    node -e 'let s="";process.stdin.on("data",d=>s+=d).on("end",()=>{try{console.log(JSON.parse(s).clientVersion.minor.replace(/\D.*$/,""))}catch(e){console.log(0)}})')
  if [ "${kubectl_minor:-0}" -lt 27 ]; then
    missing+=("kubectl 1.${kubectl_minor:-?} is too old: install kubectl >= 1.27 (kustomize v5 'labels' field)")
  fi
  node_major=$(node -p 'process.versions.node.split(".")[0]')
  if [ "$node_major" -lt 18 ]; then missing+=("node $node_major is too old: Node >= 18 is needed"); fi
fi
if [ ${#missing[@]} -gt 0 ]; then
  for m in "${missing[@]}"; do echo "deploy_lint: FAILED: $m" >&2; done
  echo "deploy_lint: 0 passed, ${#missing[@]} failed (missing tools)" >&2
  exit 1
fi

# --- npm packages of deploy/validate (kubernetes-models, yaml, dockerfilelint) ---------
# Reinstalled with `npm ci` whenever node_modules is missing or older than the lock file.
stamp=$validate/node_modules/.onlineps-lock.sha256
want=$(cat "$validate/package.json" "$validate/package-lock.json" | sha256sum | cut -d' ' -f1)
if [ ! -f "$stamp" ] || [ "$(cat "$stamp")" != "$want" ]; then
  echo "deploy_lint: npm ci in $validate (node_modules missing or stale)"
  if (cd "$validate" && npm ci --include=dev --no-audit --no-fund --loglevel=error) >"$work/npm.log" 2>&1; then
    echo "$want" >"$stamp"
  else
    sed 's/^/    /' "$work/npm.log" >&2
    echo "deploy_lint: FAILED: npm ci in $validate (needs the npm registry)" >&2
    echo "deploy_lint: 0 passed, 1 failed" >&2
    exit 1
  fi
fi

# --- 1. yamllint ------------------------------------------------------------------------
check "yamllint deploy/" yamllint --strict -c "$deploy/.yamllint.yaml" "$deploy"

# --- 2. kustomize render + schema + structure -------------------------------------------
external_secrets=(--external-secret onlineps-mcp-tokens --external-secret onlineps-curve-ps
  --external-secret onlineps-curve-worker --external-secret onlineps-curve-bridge)
targets=("$deploy/k8s/base")
for o in dev gpu curve replicated; do
  if [ ! -f "$deploy/k8s/overlays/$o/kustomization.yaml" ]; then bad "overlay $o: no kustomization.yaml"; fi
done
for k in "$deploy"/k8s/overlays/*/kustomization.yaml; do
  [ -f "$k" ] && targets+=("$(dirname "$k")")
done
for t in "${targets[@]}"; do
  name=${t#"$deploy/k8s/"}
  out=$work/render-${name//\//-}.yaml
  if ! kubectl kustomize "$t" >"$out" 2>"$work/out"; then
    bad "kubectl kustomize $name"
    sed 's/^/    /' "$work/out" >&2
    continue
  fi
  ok "kubectl kustomize $name ($(grep -c '^kind:' "$out") objects)"
  check "schemas of $name (validate.mjs)" node "$validate/validate.mjs" "$out"
  # Secrets created out of band: the bridge's tokens (the dev overlay generates them:
  # checks.mjs refuses a reference that misses the generated, hashed name) and the CURVE
  # keys of components/curve (deploy/k8s/make-curve-secrets.sh, checked below).
  check "structure of $name (checks.mjs)" node "$validate/checks.mjs" "${external_secrets[@]}" "$out"
done

# --- 2b. CURVE Secrets and broken variants ---------------------------------------------
# checks.mjs refuses broken CURVE wiring and broken replicated layouts (checks_test.mjs
# breaks the curve and replicated overlays' renders one way at a time); the Secrets
# make-curve-secrets.sh prints fit both overlays (schemas, and checks.mjs with the
# Secrets' keys); no secret key is committed.
curve_renders=()
for o in curve replicated; do
  if [ -f "$work/render-overlays-$o.yaml" ]; then
    curve_renders+=("$o")
  else
    bad "overlays/$o was not rendered"
  fi
done
if [ ${#curve_renders[@]} -eq 2 ]; then
  check "checks.mjs refuses broken CURVE and replicated manifests (checks_test.mjs)" \
    node "$validate/checks_test.mjs" "$work/render-overlays-curve.yaml" "$work/render-overlays-replicated.yaml"
fi
cli=${ONLINEPS_BIN_DIR:-$root/build/bin}/onlineps_ps_cli
if [ -x "$cli" ]; then
  if ONLINEPS_PS_CLI=$cli bash "$deploy/k8s/make-curve-secrets.sh" -o "$work/curve-secrets.yaml" >"$work/out" 2>&1; then
    for o in "${curve_renders[@]}"; do
      cat "$work/render-overlays-$o.yaml" "$work/curve-secrets.yaml" >"$work/$o-with-secrets.yaml"
      check "schemas of overlays/$o + make-curve-secrets.sh output" node "$validate/validate.mjs" "$work/$o-with-secrets.yaml"
      check "structure and keys of overlays/$o + make-curve-secrets.sh output" \
        node "$validate/checks.mjs" --external-secret onlineps-mcp-tokens "$work/$o-with-secrets.yaml"
    done
  else
    bad "deploy/k8s/make-curve-secrets.sh"
    sed 's/^/    /' "$work/out" >&2
  fi
elif [ -n "${ONLINEPS_BIN_DIR:-}" ]; then
  bad "make-curve-secrets.sh needs $cli (ONLINEPS_BIN_DIR)"
else
  echo "deploy_lint: skipped: make-curve-secrets.sh output (no onlineps_ps_cli in $root/build/bin)"
fi
# A zcert secret-key line with a real 40-character Z85 key, anywhere under deploy/.
z85_secret='secret-key[[:space:]]*=[[:space:]]*"?[][0-9A-Za-z.:+=^!/*?&<>(){}@%$#-]{40}"?'
no_committed_keys() {
  ! grep -rIEl --exclude-dir=node_modules "$z85_secret" "$deploy"
}
check "no CURVE secret key in deploy/" no_committed_keys

# --- 3. Prometheus ------------------------------------------------------------------------
prom=$deploy/prometheus
if node "$validate/promconfig.mjs" "$prom/prometheus.yml" "$work/prom" >"$work/out" 2>&1; then
  check "promtool check config prometheus.yml" "$promtool" check config "$work/prom/prometheus.yml"
else
  bad "prometheus.yml Kubernetes discovery (promconfig.mjs)"
  sed 's/^/    /' "$work/out" >&2
fi
check "promtool check rules rules.yml" "$promtool" check rules "$prom/rules.yml"
check "promtool test rules rules_test.yml" "$promtool" test rules "$prom/rules_test.yml"
renders=("$work"/render-*.yaml)
if [ -f "${renders[0]}" ]; then
  check "prometheus.yml labels every PS pod with its shard (promshards.mjs)" \
    node "$validate/promshards.mjs" "$prom/prometheus.yml" "${renders[@]}"
fi

# --- 3b. Grafana dashboard ----------------------------------------------------------------
# Offline: Grafana's import fields, panel ids and grid, variables (grafana.mjs); every query
# parses (promtool, as recording rules); the file is make_dashboard.py's output; a broken
# copy is refused. tests/system/metrics_lint.sh checks that the metrics it names exist.
dash=$deploy/grafana/onlineps.json
check "grafana dashboard lint (grafana.mjs)" node "$validate/grafana.mjs" "$dash" "$work/dash-rules.yml"
check "promtool check rules on the dashboard's queries" "$promtool" check rules "$work/dash-rules.yml"
dashboard_generated() {
  python3 "$deploy/grafana/make_dashboard.py" "$work/dash.json" >/dev/null && cmp "$dash" "$work/dash.json"
}
check "onlineps.json is make_dashboard.py's output" dashboard_generated
broken_dashboard_refused() {
  # shellcheck disable=SC2016  # JavaScript and a literal $ in single quotes
  node -e 'const d=require(process.argv[1]); d.panels[2].id=d.panels[1].id;
    d.panels[3].targets[0].expr+=" * $nosuchvar"; console.log(JSON.stringify(d))' "$dash" >"$work/broken.json"
  ! node "$validate/grafana.mjs" "$work/broken.json" 2>"$work/broken.err" &&
    grep -q "id used twice" "$work/broken.err" && grep -qF "undefined variable \$nosuchvar" "$work/broken.err"
}
check "grafana.mjs refuses a repeated panel id and an undefined variable" broken_dashboard_refused

# --- 4. shellcheck --------------------------------------------------------------------------
shopt -s nullglob
scripts=("$root"/scripts/*.sh "$root"/tests/*.sh "$root"/tests/*/*.sh)
[ -f "$root/.ci/run" ] && scripts+=("$root/.ci/run")
while IFS= read -r -d '' f; do scripts+=("$f"); done < <(find "$deploy" -name node_modules -prune -o -name '*.sh' -print0)
shopt -u nullglob
check "shellcheck (${#scripts[@]} scripts)" shellcheck -x "${scripts[@]}"

# --- 5. Dockerfiles ----------------------------------------------------------------------
dockerfiles=()
for f in "$deploy"/docker/Dockerfile*; do
  case $f in *.dockerignore) ;; *) dockerfiles+=("$f") ;; esac
done
for f in Dockerfile Dockerfile.worker Dockerfile.cuda; do
  [ -f "$deploy/docker/$f" ] || bad "deploy/docker/$f is missing"
done
ports=$(node "$validate/ports.mjs" "$work"/render-*.yaml 2>/dev/null || true)
image_conventions() {
  local f=$1 p problems=0
  if ! grep -q '^ENTRYPOINT \["/usr/bin/tini", "--"\]$' "$f"; then
    echo "no exec-form ENTRYPOINT [\"/usr/bin/tini\", \"--\"]"
    problems=1
  fi
  if ! grep -Eq '^USER [1-9][0-9]*(:[0-9]+)?$' "$f"; then
    echo "no numeric non-root USER (runAsNonRoot needs a numeric UID)"
    problems=1
  fi
  for p in $ports; do
    if ! grep -Eq "^EXPOSE( [0-9]+)* $p( |$)" "$f"; then
      echo "EXPOSE lacks $p (a containerPort of the manifests)"
      problems=1
    fi
  done
  # Pinned bases (dockerfilelint's missing_tag is off, deploy/docker/.dockerfilelintrc):
  # every FROM is scratch, an earlier stage, or an image with a tag or digest, not
  # latest, once the ARG defaults are filled in.
  awk '
    /^ARG [A-Za-z_][A-Za-z0-9_]*=/ { sub(/^ARG /, ""); k = $0; sub(/=.*/, "", k); v = $0; sub(/^[^=]*=/, "", v); arg[k] = v }
    /^FROM / {
      image = $2
      for (k in arg) gsub("\\$\\{" k "\\}", arg[k], image)
      if (image != "scratch" && !(image in stage) && (image !~ /[:@]/ || image ~ /:latest$/)) {
        print "FROM " $2 ": not a stage, and " image " is not pinned to a tag"; bad = 1
      }
      if (toupper($3) == "AS") stage[$4] = 1
    }
    END { exit bad }' "$f" || problems=1
  return "$problems"
}
for f in "${dockerfiles[@]}"; do
  rel=${f#"$deploy/"}
  check "dockerfilelint $rel" "$validate/node_modules/.bin/dockerfilelint" "$f"
  check "image conventions of $rel" image_conventions "$f"
done

# --- 6. the binaries accept the pods' environment ----------------------------------------
bin=${ONLINEPS_BIN_DIR:-$root/build/bin}
binaries=(onlineps_ps onlineps_ps_cli onlineps_worker onlineps_worker_cli onlineps_mcp_bridge)
have_bins=1
for b in "${binaries[@]}"; do [ -x "$bin/$b" ] || have_bins=0; done
if [ "$have_bins" -eq 0 ] && [ -z "${ONLINEPS_BIN_DIR:-}" ]; then
  echo "deploy_lint: skipped: pod environments against the binaries (none built in $bin; build first or set ONLINEPS_BIN_DIR)"
elif [ "$have_bins" -eq 0 ]; then
  bad "binaries ${binaries[*]} not all in ONLINEPS_BIN_DIR=$bin"
else
  mkdir -p "$work/help" "$work/wrap"
  for b in "${binaries[@]}"; do
    "$bin/$b" --help >"$work/help/$b.help" 2>&1 || true
    # Stands in for /usr/local/bin/$b in the containers' command lines.
    printf '#!/bin/sh\nexec %s --print-config "$@"\n' "'$bin/$b'" >"$work/wrap/$b"
    chmod +x "$work/wrap/$b"
  done
  for out in "$work"/render-*.yaml; do
    name=${out#"$work/render-"}
    name=${name%.yaml}
    envdir=$work/env-$name
    if ! node "$validate/podenv.mjs" "$out" "$work/help" "$envdir" >"$work/out" 2>&1; then
      bad "ONLINEPS_* names of $name (podenv.mjs)"
      sed 's/^/    /' "$work/out" >&2
      continue
    fi
    pod_problems=0
    cases=0
    while read -r n binary what; do
      cases=$((cases + 1))
      mapfile -t vars <"$envdir/$n.env"
      mapfile -d '' -t argv <"$envdir/$n.argv"
      # The pod's exact command line (a start script included), the image's binaries
      # replaced by the wrappers: `<binary> --print-config`.
      argv=("${argv[@]//\/usr\/local\/bin\//$work/wrap/}")
      rc=0
      env -i PATH=/usr/bin:/bin "${vars[@]}" "${argv[@]}" >"$work/out" 2>"$work/err" </dev/null || rc=$?
      if [ -f "$envdir/$n.refuse" ]; then
        phrase=$(cat "$envdir/$n.refuse")
        if [ "$rc" -eq 0 ] || ! grep -qF -- "$phrase" "$work/err"; then
          echo "    $what: the start script does not refuse it (exit $rc; expected a message with '$phrase'):" >&2
          head -n 3 "$work/out" | cat - "$work/err" | sed 's/^/      /' >&2
          pod_problems=1
        fi
        continue
      fi
      if [ "$rc" -ne 0 ]; then
        echo "    $what: $binary refuses the pod environment (exit $rc):" >&2
        sed 's/^/      /' "$work/out" "$work/err" >&2
        pod_problems=1
        continue
      fi
      while IFS= read -r line; do
        if ! grep -qxF -- "$line" "$work/out"; then
          echo "    $what: --print-config lacks '$line':" >&2
          sed 's/^/      /' "$work/out" >&2
          pod_problems=1
        fi
      done <"$envdir/$n.expect"
    done <"$envdir/containers"
    if [ "$pod_problems" -eq 0 ]; then
      ok "pod environments of $name accepted by the binaries (--print-config, $cases pod cases)"
    else
      bad "pod environments of $name (--print-config)"
    fi
  done
fi

if [ "$failed" -gt 0 ]; then
  echo "deploy_lint: $passed passed, $failed failed" >&2
  exit 1
fi
echo "deploy_lint: $passed passed, 0 failed"
