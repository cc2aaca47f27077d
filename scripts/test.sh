#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds Shoal with AddressSanitizer + UBSan, runs every test.
# (The README's second command; .ci/run calls it.) Fixtures: $SHOAL_FIXTURES or ../shared/fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Benchmarks are left to the Release build (README command 1): they are figures, not tests.
cmake -S . -B build-test -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_SANITIZE=ON -DSHOAL_BENCH=OFF
cmake --build build-test
ctest --test-dir build-test --output-on-failure -j "$(nproc)" --timeout 600
