#!/usr/bin/env bash
# Runs one MCP client test file with node's test runner, installing the pinned SDKs first when
# node_modules is missing (npm ci from package-lock.json). An install failure fails the test.
# Usage: tests/bridge/mcp/run.sh sdk_http.test.mjs   (ONLINEPS_BIN_DIR: where the binaries are)
set -euo pipefail
cd "$(dirname "$0")"
if [[ $# -lt 1 ]]; then
  echo "usage: $0 TEST_FILE..." >&2
  exit 2
fi
command -v node >/dev/null || { echo "run.sh: node not found on PATH" >&2; exit 1; }
command -v npm >/dev/null || { echo "run.sh: npm not found on PATH" >&2; exit 1; }
# node_modules/.package-lock.json is written by npm at the end of a complete install; reinstall
# when it is missing or older than package-lock.json.
needs_install() {
  [[ ! -f node_modules/.package-lock.json || package-lock.json -nt node_modules/.package-lock.json ]]
}
# Parallel CTest runs share one node_modules: install under a lock, once.
if needs_install; then
  exec 9>.npm-install.lock
  flock 9
  if needs_install; then
    echo "run.sh: installing pinned MCP SDKs (npm ci)" >&2
    if ! npm ci --no-audit --no-fund >&2; then
      echo "run.sh: npm ci failed; the MCP client tests cannot run" >&2
      exit 1
    fi
  fi
  flock -u 9
fi
# The v2 SDK needs node >= 20; Debian 12's own nodejs is 18: then run on the npm package node@22.
major=$(node -p 'process.versions.node.split(".")[0]')
if (( major < 20 )); then
  exec npx -y -p node@22 -c "node --test $*"
fi
exec node --test "$@"
