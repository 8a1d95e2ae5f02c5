#!/usr/bin/env bash
# Installs the Debian packages Kvasir needs. Idempotent: re-running is cheap.
#   install-deps.sh           what building the `kvasir` binary needs (the README's first command)
#   install-deps.sh --tests   that, and what the test suites, fuzzers and benchmarks need
#                             (scripts/test.sh)
set -euo pipefail

# The OpenCL ICD loader and headers build the OpenCL backend in (docs/BACKENDS.md); without them
# the build leaves it out.
build=(
  cmake ninja-build ccache pkg-config g++
  libhwy-dev libcli11-dev nlohmann-json3-dev libfmt-dev libssl-dev
  libboost-dev libsodium-dev libsqlite3-dev libpq-dev libpcre2-dev
  ocl-icd-opencl-dev opencl-c-headers
)
# GoogleTest/Benchmark; clang-14 and its runtime for the fuzzers; openssl (test certificates),
# nginx (fetch tests), iproute2/nftables/tcpdump (network-namespace tests), procps, curl and
# chromium (the market end to end), python3 (the independent checks and the test summary), PoCL
# (an OpenCL device on the CPU, on which every OpenCL test runs) and clinfo, nodejs and npm (the
# `openai` npm package as the client of `kvasir serve`), postgresql (the market's store tests
# start a server of their own).
tests=(
  libgtest-dev libgmock-dev libbenchmark-dev clang-14 libclang-rt-14-dev
  openssl nginx iproute2 nftables tcpdump procps curl chromium python3 nodejs npm
  pocl-opencl-icd clinfo postgresql
)

packages=("${build[@]}")
case "${1:-}" in
  "") ;;
  --tests) packages+=("${tests[@]}") ;;
  *) echo "usage: $0 [--tests]" >&2; exit 2 ;;
esac

# A Node.js from elsewhere (NodeSource's nodejs bundles npm and conflicts with Debian's npm
# package) counts when `node` and `npm` work: installing Debian's npm would remove it.
installed() {
  case "$1" in
    nodejs) command -v node >/dev/null && return 0 ;;
    npm) command -v npm >/dev/null && return 0 ;;
  esac
  dpkg-query -W -f='${Status}' "$1" 2>/dev/null | grep -q "install ok installed"
}
missing=()
for p in "${packages[@]}"; do
  installed "$p" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "install-deps: all ${#packages[@]} packages present"
  exit 0
fi
SUDO=""
if [ "$(id -u)" -ne 0 ]; then SUDO="sudo"; fi
echo "install-deps: installing ${missing[*]}"
$SUDO apt-get update -qq
DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
