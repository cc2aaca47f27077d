#!/usr/bin/env bash
# Installs every Debian 12 package that Shoal's build, tests, fuzz targets and benchmarks need.
# Run as root (or with sudo available) on a fresh Debian 12 machine. Idempotent.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config git
  clang libclang-rt-14-dev            # libFuzzer targets, sanitizer runtimes
  libgtest-dev libgmock-dev libbenchmark-dev
  libfmt-dev libspdlog-dev nlohmann-json3-dev libcli11-dev
  libpcre2-dev libasio-dev libcpp-httplib-dev libssl-dev libcurl4-openssl-dev
  iproute2                            # network namespaces + tc netem for pool benchmarks
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -gt 0 ]; then
  SUDO=""
  [ "$(id -u)" -eq 0 ] || SUDO="sudo"
  export DEBIAN_FRONTEND=noninteractive
  $SUDO apt-get update -qq
  $SUDO apt-get install -y -qq --no-install-recommends "${missing[@]}"
fi
echo "setup: all ${#pkgs[@]} packages present"
