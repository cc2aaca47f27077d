#!/usr/bin/env bash
# pool_netns.sh: a pool whose stages live in separate network namespaces, one "machine" each,
# joined by veth pairs on a bridge (10.77.0.0/24), so every hop crosses a real network interface.
# With DELAY_MS > 0 each namespace's interface gets `tc qdisc ... netem delay DELAY_MS` (one-way
# latency per hop); when the kernel has no netem the script says so and stops, unless DELAY_MS is
# 0. Needs root and iproute2. The namespaces, veths and bridge are removed on exit, also on failure.
#
#   bench/pool_netns.sh build-rel/shoal models/stories260K.gguf 3 0 [-p PROMPT -n 64 ...]
#
# Prints the host's timing line ("prompt N tokens in ... generated M tokens in ... tok/s").
set -euo pipefail

if [ $# -lt 4 ]; then
  echo "usage: $0 SHOAL MODEL STAGES DELAY_MS [host flags...]" >&2
  exit 2
fi
SHOAL=$(readlink -f "$1"); MODEL=$(readlink -f "$2"); N=$3; DELAY=$4; shift 4
[ "$N" -ge 1 ] || { echo "STAGES must be >= 1" >&2; exit 2; }
TAG=sp$$  # short: interface names are limited to 15 characters
BR=${TAG}br
SECRET=$(head -c 16 /dev/urandom | od -An -tx1 | tr -d ' \n')
PIDS=()

cleanup() {
  for p in "${PIDS[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
  for i in $(seq 0 $((N - 1))); do
    ip netns del "${TAG}n$i" 2>/dev/null || true
    ip link del "${TAG}v$i" 2>/dev/null || true
  done
  ip link del "$BR" 2>/dev/null || true
}
trap cleanup EXIT INT TERM

ip link add "$BR" type bridge
ip link set "$BR" up
for i in $(seq 0 $((N - 1))); do
  ns=${TAG}n$i
  ip netns add "$ns"
  ip link add "${TAG}v$i" type veth peer name "${TAG}p$i"
  ip link set "${TAG}v$i" master "$BR" up
  ip link set "${TAG}p$i" netns "$ns"
  ip -n "$ns" addr add "10.77.0.$((i + 1))/24" dev "${TAG}p$i"
  ip -n "$ns" link set "${TAG}p$i" up
  ip -n "$ns" link set lo up
  if [ "$DELAY" != "0" ]; then
    if ! ip netns exec "$ns" tc qdisc add dev "${TAG}p$i" root netem delay "${DELAY}ms" 2>/dev/null; then
      echo "pool_netns: this kernel has no netem qdisc; cannot inject ${DELAY} ms (run with DELAY_MS 0," \
           "or use pool_bench --delay-ms, which delays in userspace)" >&2
      exit 3
    fi
  fi
done

LOG=$(mktemp)
SHOAL_SECRET=$SECRET ip netns exec "${TAG}n0" "$SHOAL" host -m "$MODEL" --listen 10.77.0.1:7000 \
  --workers $((N - 1)) "$@" >/dev/null 2>"$LOG" &
HOST=$!
PIDS+=("$HOST")
for _ in $(seq 100); do grep -q "room open" "$LOG" && break; sleep 0.1; done
for i in $(seq 1 $((N - 1))); do
  SHOAL_SECRET=$SECRET ip netns exec "${TAG}n$i" "$SHOAL" --log-level warning join 10.77.0.1:7000 \
    --name "ns$i" -m "$MODEL" >/dev/null 2>&1 &
  PIDS+=("$!")
done
status=0
wait "$HOST" || status=$?
grep -E "plan|ns[0-9]|generated" "$LOG" >&2 || true
[ $status -eq 0 ] || { cat "$LOG" >&2; exit $status; }
grep "generated" "$LOG"
rm -f "$LOG"
