#!/usr/bin/env bash
# The one entry point for GPU checks, run on a machine with an NVIDIA GPU (the H200 of the
# `device` tool): builds Shoal in Release with the CUDA backend (sm_90 only, to save compile
# time), runs every GPU test (label gpu), the CUDA kernel benchmarks, `shoal check` on the HF
# fixtures and stories260K greedy decoding with --device cuda:0, local pools (on this card, mixed
# with the CPU, and over cuda:0,cuda:1 where two GPUs are visible), and prints a short table last.
# Exit status 1 if the build, a GPU test, a `shoal check`, the greedy text or a pool comparison
# failed, or if no GPU test ran (all skipped: no device visible); benchmarks are figures only.
#
#   SHOAL_FIXTURES=/path/to/fixtures scripts/gpu-check.sh
#
# Environment:
#   SHOAL_FIXTURES      fixtures folder (hf/llama, hf/qwen3, models/stories260K.gguf,
#                       expected/stories260K_greedy.json); default ../shared/fixtures
#   SHOAL_GPU_BUILD     build folder (default build-gpu)
#   SHOAL_GPU_PREBUILT  a build folder made elsewhere (same layout; lib/ holds extra shared
#                       libraries): skip configure and build, run what is there
#                       (scripts/gpu-prebuilt.sh makes one, for machines that cannot build)
#   SHOAL_GPU_BENCH     "full" (default), "quick" (ceilings, decode steps, tensor-core rates, the
#                       quantized GEMM by work item) or "off"
#   SHOAL_GPU_MODELS    shape:type pairs for `shoal bench` (default with "full": llama3-8b:q4_0
#                       llama3-8b:q8_0 llama3-8b:f16 qwen3-0.6b:f16; with "quick": none)
#   SHOAL_GPU_TEST_TIMEOUT  seconds per shard of the test executable (default 400)
#   SHOAL_GPU_TEST_SHARDS   test processes at once (default: half the cores, at most 8)
#   OUT                 if set, full logs go there
set -uo pipefail
cd "$(dirname "$0")/.."
FIX=${SHOAL_FIXTURES:-$(cd .. && pwd)/shared/fixtures}
export SHOAL_FIXTURES=$FIX
LOGS=${OUT:-$(mktemp -d)}
mkdir -p "$LOGS"
BENCH_MODE=${SHOAL_GPU_BENCH:-full}
declare -a SUMMARY=()
note() { SUMMARY+=("$1"); echo "== $1"; }

nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total,clocks.sm,clocks.mem --format=csv || true

if [ -n "${SHOAL_GPU_PREBUILT:-}" ]; then
  BUILD=$SHOAL_GPU_PREBUILT
  export LD_LIBRARY_PATH="$BUILD/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
  note "build: prebuilt $BUILD"
else
  BUILD=${SHOAL_GPU_BUILD:-build-gpu}
  t0=$(date +%s)
  if cmake -S . -B "$BUILD" -G Ninja -DCMAKE_BUILD_TYPE=Release -DSHOAL_CUDA=ON -DSHOAL_SANITIZE=OFF \
       -DCMAKE_CUDA_ARCHITECTURES=90 >"$LOGS/configure.log" 2>&1 &&
     cmake --build "$BUILD" -j"$(nproc)" >"$LOGS/build.log" 2>&1; then
    note "build: ok in $(( $(date +%s) - t0 )) s"
  else
    tail -40 "$LOGS/configure.log" "$LOGS/build.log" 2>/dev/null
    note "build: FAILED (see build.log)"
    printf '%s\n' "${SUMMARY[@]}"
    exit 1
  fi
fi

# GPU tests: tests/cuda/*_test.cc (ctest label gpu), linked into one executable, run as
# SHOAL_GPU_TEST_SHARDS processes at once (gtest sharding; default: half the cores, at most 8):
# most of their time is the CPU reference, single-threaded.
fails=0
fail() { fails=$((fails + 1)); note "$1"; }
[ -x "$BUILD/tests/shoal_gpu_tests" ] || fail "test: FAILED (no $BUILD/tests/shoal_gpu_tests)"
cores=$(nproc)
SHARDS=${SHOAL_GPU_TEST_SHARDS:-$(( cores / 2 > 8 ? 8 : (cores / 2 < 1 ? 1 : cores / 2) ))}
# run_sharded LOG COMMAND...: COMMAND in SHARDS processes (GTEST_SHARD_INDEX), each under the
# timeout; their logs one after the other in LOG. Status 0 if every shard passed.
run_sharded() {
  local log=$1 i rc=0
  shift
  local pids=()
  for ((i = 0; i < SHARDS; i++)); do
    GTEST_TOTAL_SHARDS=$SHARDS GTEST_SHARD_INDEX=$i timeout "${SHOAL_GPU_TEST_TIMEOUT:-400}" "$@" >"$log.shard$i" 2>&1 &
    pids+=($!)
  done
  for i in "${!pids[@]}"; do wait "${pids[$i]}" || rc=1; done
  for ((i = 0; i < SHARDS; i++)); do cat "$log.shard$i"; rm -f "$log.shard$i"; done >"$log"
  return $rc
}
# "N passed, N failed, N skipped" over the shards of a gtest log.
gtest_counts() {
  awk '/^\[  PASSED  \] [0-9]+/ {p += $4} /^\[  SKIPPED \] [0-9]+/ {s += $4} /^\[  FAILED  \] [0-9]+ tests?,/ {f += $4}
       END {printf "%d passed, %d failed, %d skipped", p - 0, f - 0, s - 0}' "$1"
}
# "slowest NAME N.N s" of a gtest log (where the shards' time goes), or nothing.
gtest_slowest() {
  awk '/^\[       OK \] .* \([0-9]+ ms\)$/ {ms = substr($(NF - 1), 2) + 0; if (ms > best) {best = ms; name = $4}}
       END {if (best > 0) printf "; slowest %s %.1f s", name, best / 1000}' "$1"
}
# Whether most tests ran: more passed than skipped (a machine without a device skips them all).
most_ran() { awk '/^\[  PASSED  \] [0-9]+/ {p += $4} /^\[  SKIPPED \] [0-9]+/ {s += $4} END {exit !(p > s)}' "$1"; }
# gpu_tests NAME LOG COMMAND...: runs, counts, notes.
gpu_tests() {
  local name=$1 log=$2 r=ok
  shift 2
  t0=$(date +%s)
  run_sharded "$log" "$@" || r=FAILED
  if [ "$r" = ok ] && ! most_ran "$log"; then r="FAILED (most tests skipped: no device?)"; fi
  [ "$r" = ok ] || { fails=$((fails + 1)); grep -E '^\[  FAILED  \]|Failure|error|Expected|Which is|nerr|trace' "$log" | head -30; }
  note "test $name: $r ($(gtest_counts "$log"); $SHARDS shards, $(( $(date +%s) - t0 )) s$(gtest_slowest "$log"))"
}
# Tests that measure the device's free memory (cudaMemGetInfo counts every process) or take all
# of it for a while run alone, after the shards.
SERIAL='*WeightsAllocatedTogetherFreeTheirBlockWithTheLast*:*ScratchOutOfMemory*'
for t in "$BUILD"/tests/shoal_gpu_tests "$BUILD"/tests/cuda_*_test; do
  [ -x "$t" ] || continue
  gpu_tests "$(basename "$t")" "$LOGS/$(basename "$t").log" "$t" --gtest_color=no --gtest_filter="-$SERIAL"
  SHARDS=1 gpu_tests "$(basename "$t"), alone" "$LOGS/$(basename "$t")-alone.log" "$t" --gtest_color=no \
    --gtest_filter="$SERIAL"
done
# The attention tests again without thread-block clusters: decode splits combined by a kernel
# (the path of pre-sm_90 devices).
if [ -x "$BUILD/tests/shoal_gpu_tests" ]; then
  gpu_tests "attention, SHOAL_CUDA_CLUSTERS=0" "$LOGS/attention_no_clusters.log" \
    env SHOAL_CUDA_CLUSTERS=0 "$BUILD/tests/shoal_gpu_tests" --gtest_color=no --gtest_filter='*Attention*'
fi

# End to end with --device cuda:0: logits against the HF references, greedy stories260K.
SHOAL="$BUILD/shoal"
[ -x "$SHOAL" ] || fail "end to end: FAILED (no $SHOAL)"
[ -f "$FIX/models/stories260K.gguf" ] || fail "stories260K: FAILED (no $FIX/models/stories260K.gguf)"
if [ -x "$SHOAL" ]; then
  for arch in llama qwen3; do
    for form in hf gguf; do
      m="$FIX/hf/$arch"; [ "$form" = gguf ] && m="$m/model-bf16.gguf"
      for kv in f32; do
        full=$("$SHOAL" --log-level warn check -m "$m" --reference "$FIX/hf/$arch/reference.safetensors" \
               --device cuda:0 --kv "$kv" 2>&1); rc=$?
        out=$(tail -3 <<<"$full" | tr '\n' ' ')
        if [ "$rc" = 0 ]; then note "shoal check $arch $form kv=$kv cuda:0: $out"
        else fail "shoal check $arch $form kv=$kv cuda:0: FAILED (exit $rc): $out"; fi
      done
    done
    # The HF folder again with its BF16 weights kept as BF16 (three bf16 activation parts, the
    # BF16 stacked and fused paths), which settle_weights would otherwise hold as F16.
    full=$(SHOAL_CUDA_BF16_AS_F16=0 "$SHOAL" --log-level warn check -m "$FIX/hf/$arch" \
           --reference "$FIX/hf/$arch/reference.safetensors" --device cuda:0 --kv f32 2>&1); rc=$?
    out=$(tail -3 <<<"$full" | tr '\n' ' ')
    if [ "$rc" = 0 ]; then note "shoal check $arch hf kv=f32 cuda:0, BF16 kept (SHOAL_CUDA_BF16_AS_F16=0): $out"
    else fail "shoal check $arch hf kv=f32 cuda:0, BF16 kept: FAILED (exit $rc): $out"; fi
    # The HF folder with one 16-bit activation part in the prefill products (the fixtures' BF16
    # weights, held as F16 by settle_weights unless SHOAL_CUDA_BF16_AS_F16=0): the
    # error llama.cpp-style numerics give, for the record (the default tolerance may refuse it).
    # With an f16 cache the prompt's attention takes one part too (AttnArgs::one_part).
    for kv in f32 f16; do
      out=$("$SHOAL" --log-level warn check -m "$FIX/hf/$arch" --reference "$FIX/hf/$arch/reference.safetensors" \
            --device cuda:0 --prefill-precision half --kv "$kv" 2>&1 | tail -3 | tr '\n' ' ')
      note "shoal check $arch hf cuda:0 --prefill-precision half kv=$kv (the error, for the record; its exit status is no check): $out"
    done
  done
  if [ -f "$FIX/models/stories260K.gguf" ]; then
    want=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['cases'][0]['generated_text'])" \
           "$FIX/expected/stories260K_greedy.json" 2>/dev/null)
    got=$("$SHOAL" --log-level off run -m "$FIX/models/stories260K.gguf" -p "Once upon a time" -n 48 --temp 0 \
          --device cuda:0 2>&1)
    if [ -n "$want" ] && [ "$got" = "$want" ]; then note "stories260K greedy cuda:0: equal to the fixture"
    else fail "stories260K greedy cuda:0: DIFFERS: got '$got'"; fi
  fi
fi

NGPU=$(nvidia-smi -L 2>/dev/null | grep -c '^GPU ')
NGPU=${NGPU:-0}
if [ -n "${CUDA_VISIBLE_DEVICES+x}" ]; then  # (nvidia-smi lists every card; the process sees these)
  NGPU=$(tr ',' '\n' <<<"$CUDA_VISIBLE_DEVICES" | grep -c .)
fi
# A pool of 2 processes, each with its own CUDA context on this GPU, gives the ids of one process
# (f32 hops); and the Q8_0 KV cache runs. The prompt spans several 16-token frames, so the worker
# (it ends the model) keeps no row of the first frames and only the last row of the last one.
POOL_PROMPT="Once upon a time, there was a little girl named Lily. She loved to play outside in the park with her friends."
if [ -x "$SHOAL" ]; then
  # The pools: 2 processes on cuda:0; with two GPUs or more also a --device list over them (host
  # on cuda:0, the worker on cuda:1, each lending its own card). `shoal check` runs over the cards
  # and over cuda:0 mixed with the CPU (the worker on cpu: layers a card cannot hold, as
  # llama.cpp's partial offload), meeting the reference like one process.
  pools=("--device cuda:0 --pool 2")
  checks=(cuda:0,cpu)
  if [ "$NGPU" -ge 2 ]; then pools+=("--device cuda:0,cuda:1"); checks+=(cuda:0,cuda:1); fi
  for m in models/stories260K.gguf hf/llama hf/qwen3; do
    base=("$SHOAL" --log-level off run -m "$FIX/$m" -p "$POOL_PROMPT" -n 24 -c 256 --temp 0 --output-ids)
    one=$("${base[@]}" --device cuda:0 2>&1 | tail -1)
    for pool in "${pools[@]}"; do
      # shellcheck disable=SC2086  # (the pool's flags, word-split on purpose)
      two=$("${base[@]}" $pool --hop-dtype f32 2>&1 | tail -1)
      if [[ "$one" == "["*"]" ]] && [ "$one" = "$two" ]; then note "pool ($pool), f32 hops, $m: same ids as one process"
      else fail "pool ($pool), f32 hops, $m: DIFFERS: one '$one' pool '$two'"; fi
    done
  done
  for devs in "${checks[@]}"; do
    for arch in llama qwen3; do
      full=$("$SHOAL" --log-level warn check -m "$FIX/hf/$arch" --reference "$FIX/hf/$arch/reference.safetensors" \
             --device "$devs" --hop-dtype f32 --kv f32 2>&1); rc=$?
      out=$(tail -1 <<<"$full")
      if [ "$rc" = 0 ]; then note "shoal check $arch hf over $devs (f32 hops): $out"
      else fail "shoal check $arch hf over $devs: FAILED (exit $rc): $out"; fi
    done
  done
  # (The fixture is llama.cpp's text with an f16 cache, so a Q8_0 cache may differ; only a failed
  # run fails the check.)
  q8=$("$SHOAL" --log-level off run -m "$FIX/models/stories260K.gguf" -p "Once upon a time" -n 48 --temp 0 \
       --device cuda:0 --kv q8_0 2>&1); rc=$?
  if [ "$rc" != 0 ]; then fail "stories260K greedy cuda:0 --kv q8_0: FAILED (exit $rc): '$q8'"
  else note "stories260K greedy cuda:0 --kv q8_0: $( [ "$q8" = "${want:-}" ] && echo "equal to the fixture" || echo "'$q8'")"; fi
fi

# Benchmarks (figures, not pass/fail).
if [ "$BENCH_MODE" != off ] && [ -x "$BUILD/bench/cuda_kernels" ]; then
  args=(); [ "$BENCH_MODE" = quick ] && args+=(--quick)
  "$BUILD/bench/cuda_kernels" "${args[@]}" 2>&1 | tee "$LOGS/cuda_kernels.log"
  # The tensor cores' rates at the quantized prefill GEMM's widths (what a call of few tokens can
  # get from wgmma), against mma.sync.
  "$BUILD/bench/cuda_kernels" --tensor --reps 5 2>&1 | tee "$LOGS/cuda_kernels-tensor.log"
  # The quantized prefill GEMM by work item (64 or 128 tokens) and token count, and the width
  # gemm_quant takes.
  "$BUILD/bench/cuda_kernels" --gemm-items --reps 10 2>&1 | tee "$LOGS/cuda_kernels-items.log"
fi

# shoal bench --device cuda:0 on synthetic random-weight GGUFs of real shapes, written here by the
# project's own GGUF writer (bench/synthetic_gguf): tg128 after a 512-token prompt, pp512.
SYN="$BUILD/bench/synthetic_gguf"
BENCH_MODELS=${SHOAL_GPU_MODELS:-}
[ "$BENCH_MODE" = full ] && [ -z "$BENCH_MODELS" ] && BENCH_MODELS="llama3-8b:q4_0 llama3-8b:q8_0 llama3-8b:f16 qwen3-0.6b:f16"
if [ "$BENCH_MODE" != off ] && [ -n "$BENCH_MODELS" ] && [ -x "$SYN" ] && [ -x "$SHOAL" ]; then
  MODELS=${SHOAL_GPU_MODELS_DIR:-/tmp/shoal-synthetic}
  mkdir -p "$MODELS"
  for st in $BENCH_MODELS; do
    shape=${st%%:*}; type=${st##*:}; f="$MODELS/$shape-$type.gguf"
    "$SYN" --shape "$shape" --type "$type" -o "$f" >"$LOGS/synthetic-$shape-$type.log" 2>&1 || { note "synthetic $st: FAILED"; continue; }
    "$SHOAL" --log-level warn bench -m "$f" -p 512 -n 128 --device cuda:0 2>&1 | tee "$LOGS/bench-$shape-$type.log"
    # The prefill again with --prefill-precision half (one activation part; quantized weights take
    # it on Hopper).
    "$SHOAL" --log-level warn bench -m "$f" -p 512 -n 0 --device cuda:0 --prefill-precision half 2>&1 |
      tee -a "$LOGS/bench-$shape-$type.log"
    while read -r line; do note "bench $shape $type: $line"; done < <(grep -E '\| (pp|tg)[0-9]+( \(half\))? \|' "$LOGS/bench-$shape-$type.log")
    # The first model again with a Q8_0 KV cache (half the cache bytes; its attention runs the
    # tensor-core kernels as f16 caches do: docs/cuda.md v42), and at a long context (4096 + 64)
    # with both caches.
    if [ "$st" = "${BENCH_MODELS%% *}" ]; then
      # Prompts in steps of a pool's 16-token frames and of 8 tokens (drafts, a prompt's tail).
      for b in 16 8; do
        "$SHOAL" --log-level warn bench -m "$f" -p 128 -n 0 -b "$b" --device cuda:0 >"$LOGS/bench-$shape-$type-b$b.log" 2>&1
        while read -r line; do note "bench $shape $type -b $b: $line"; done < <(grep -E '\| pp[0-9]+ \|' "$LOGS/bench-$shape-$type-b$b.log")
      done
      for run in "512 128 q8_0" "4096 64 f16" "4096 64 q8_0"; do
        read -r pp tg kv <<<"$run"
        lg="$LOGS/bench-$shape-$type-kv-$kv-$pp.log"
        long=(); [ "$pp" -gt 512 ] && long=(-r 2 -c $((pp + tg + 40)))
        "$SHOAL" --log-level warn bench -m "$f" -p "$pp" -n "$tg" "${long[@]}" --device cuda:0 --kv "$kv" >"$lg" 2>&1
        while read -r line; do note "bench $shape $type --kv $kv: $line"; done < <(grep -E '\| (pp|tg)[0-9]+ \|' "$lg")
      done
    fi
    # The first model as a pool of 1 and 2 processes on this card, and with two GPUs over both
    # (bench/pool_bench: laps of one token through the host, 512-token prompt, 128 laps).
    if [ "$st" = "${BENCH_MODELS%% *}" ] && [ -x "$BUILD/bench/pool_bench" ]; then
      devices=(cuda:0); [ "$NGPU" -ge 2 ] && devices+=(cuda:0,cuda:1)
      for devs in "${devices[@]}"; do
        "$BUILD/bench/pool_bench" -m "$f" --stages 1,2 --processes --shoal "$SHOAL" --device "$devs" --prompt 512 \
          --gen 128 >"$LOGS/pool-bench-$devs.log" 2>&1 || note "pool_bench $shape $type --device $devs: FAILED"
        while read -r line; do note "pool_bench $shape $type: $line"; done < <(grep -E '^\| [^ ]+\.gguf \|' "$LOGS/pool-bench-$devs.log")
      done
    fi
    rm -f "$f"
  done
fi

echo
echo "## gpu-check summary"
printf '%s\n' "${SUMMARY[@]}"
[ "$fails" = 0 ] && echo "gpu-check: every check passed" || echo "gpu-check: $fails check(s) FAILED"
[ -f "$LOGS/cuda_kernels.log" ] && grep -A9 -E '^## (Ceilings|Prefill attention|Decode step)' "$LOGS/cuda_kernels.log"
[ -f "$LOGS/cuda_kernels-tensor.log" ] && grep -A6 -E '^## (wgmma|mma.sync)' "$LOGS/cuda_kernels-tensor.log"
[ -f "$LOGS/cuda_kernels-items.log" ] && grep -E "^## Quantized|^\| weights|layer's four" "$LOGS/cuda_kernels-items.log"
exit $((fails > 0))
