#!/usr/bin/env bash
# Installs the Debian packages Kvasir builds and tests with. Idempotent: re-running is cheap.
set -euo pipefail

packages=(
  cmake ninja-build ccache pkg-config g++ clang-14 libclang-rt-14-dev
  libhwy-dev libcli11-dev nlohmann-json3-dev libfmt-dev libssl-dev
  libboost-dev libsodium-dev libsqlite3-dev libpcre2-dev openssl python3 nginx iproute2 nftables tcpdump procps chromium
  libgtest-dev libgmock-dev libbenchmark-dev
)

missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
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
