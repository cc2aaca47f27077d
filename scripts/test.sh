#!/usr/bin/env bash
# Sets up a fresh Debian 12 machine, builds Shoal with AddressSanitizer + UBSan, runs every test.
# (The README's second command; .ci/run calls it.) Fixtures: $SHOAL_FIXTURES or ../shared/fixtures.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
# Benchmarks are left to the Release build (README command 1): they are figures, not tests.
# On CI's 2 cores the build is most of the time, so sources compile in batches (CMake's unity
# build: the inline code of the headers is generated once per batch instead of once per file), and
# CUDA is compiled for sm_80 and sm_90 only, which covers both of the kernels' code paths. README
# command 1 (the Release build) still compiles every file alone, and CUDA for sm_86 and sm_89 too.
cmake -S . -B build-test -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DSHOAL_SANITIZE=ON -DSHOAL_BENCH=OFF \
  -DCMAKE_UNITY_BUILD=ON -DCMAKE_CUDA_ARCHITECTURES="80-real;90"
cmake --build build-test
ctest --test-dir build-test --output-on-failure -j "$(nproc)" --timeout 600
