#!/usr/bin/env bash
# Builds the CUDA binaries that scripts/gpu-check.sh runs (Release, sm_90) on this machine and packs
# them for a GPU machine that cannot build them: the `device` tool's image lacks the asio and
# cpp-httplib headers and cannot download. Writes into DIR (default .device, git-ignored):
#   DIR/prebuilt.tar.xz  prebuilt/{shoal, tests/shoal_gpu_tests, bench/cuda_kernels, bench/pool_bench,
#                        bench/synthetic_gguf, lib/ (the fmt and spdlog shared libraries)}
#   DIR/fixtures/        the fixtures gpu-check reads (hf/llama, hf/qwen3, stories260K, expected/)
# On the GPU machine (DIR carried with the working tree):
#   mkdir -p /tmp/pb && tar -C /tmp/pb -xJf DIR/prebuilt.tar.xz
#   SHOAL_GPU_PREBUILT=/tmp/pb/prebuilt SHOAL_FIXTURES=$PWD/DIR/fixtures scripts/gpu-check.sh
# Environment: SHOAL_GPU_BUILD (build folder, default build-rel), SHOAL_FIXTURES (default
# ../shared/fixtures).
set -euo pipefail
cd "$(dirname "$0")/.."
DIR=${1:-.device}
BUILD=${SHOAL_GPU_BUILD:-build-rel}
FIX=${SHOAL_FIXTURES:-$(cd .. && pwd)/shared/fixtures}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHOAL_CUDA=ON -DSHOAL_SANITIZE=OFF \
  -DCMAKE_CUDA_ARCHITECTURES=90 >/dev/null
cmake --build "$BUILD" --target shoal shoal_gpu_tests cuda_kernels synthetic_gguf pool_bench
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
p=$tmp/prebuilt
mkdir -p "$p/tests" "$p/bench" "$p/lib" "$DIR/fixtures/hf" "$DIR/fixtures/models"
cp "$BUILD/shoal" "$p/"
cp "$BUILD/tests/shoal_gpu_tests" "$p/tests/"
cp "$BUILD/bench/cuda_kernels" "$BUILD/bench/synthetic_gguf" "$BUILD/bench/pool_bench" "$p/bench/"
for b in "$p/shoal" "$p/tests/shoal_gpu_tests" "$p"/bench/*; do
  ldd "$b" | awk '/=>/ {print $3}' | grep -E 'libfmt|libspdlog' || true
done | sort -u | xargs -r -I{} cp -L {} "$p/lib/"
tar -C "$tmp" -cJf "$DIR/prebuilt.tar.xz" prebuilt
cp -r "$FIX/hf/llama" "$FIX/hf/qwen3" "$DIR/fixtures/hf/"
cp "$FIX/models/stories260K.gguf" "$DIR/fixtures/models/"
cp -r "$FIX/expected" "$DIR/fixtures/"
du -sh "$DIR/prebuilt.tar.xz" "$DIR/fixtures"
