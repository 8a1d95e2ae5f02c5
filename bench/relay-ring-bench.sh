#!/usr/bin/env bash
# Tokens/s of a 3-stage local ring with 0, 1 or all 3 links relayed through a local `kvasir relay`
# (plain ws on loopback), measured with `kvasir bench --ring`.
# Usage: bench/relay-ring-bench.sh MODEL [bench flags...]
# Example: bench/relay-ring-bench.sh build/bench-models/tinyllama-8l-q4_0.gguf --streams 1 -n 64 -p 16 -r 3
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: $0 MODEL [bench flags]}
shift
bin=./build/bin/kvasir
n_layer=$($bin inspect "$model" | awk '/\.block_count/ {print $3; exit}')
work=$(mktemp -d)
head -c 32 /dev/urandom >"$work/secret"
pids=()
stop() { kill "${pids[@]}" 2>/dev/null || true; wait "${pids[@]}" 2>/dev/null || true; pids=(); }
trap 'stop; rm -rf "$work"' EXIT
base=$((19000 + RANDOM % 500))
relay_port=$((base + 10))
$bin relay --listen 127.0.0.1:$relay_port --secret-file "$work/secret" --log-level warn &
pids_relay=$!
trap 'stop; kill $pids_relay 2>/dev/null; rm -rf "$work"' EXIT
sleep 0.3
relayed_links=${RELAYED:-"0 1 3"}
for relayed in $relayed_links; do
  for ((i = 0; i < 3; i++)); do
    first=$((i * n_layer / 3))
    last=$(((i + 1) * n_layer / 3))
    next=$(((i + 1) % 3))
    prev=$(((i + 2) % 3))
    args=(stage -m "$model" --layers "$first:$last" --listen "127.0.0.1:$((base + i))" --name "s$i"
      -t 1 --log-level error --ring-secret-file "$work/secret" --key "$work/s$i.key")
    # Edge i -> i+1 is relayed when i < relayed.
    if [ "$i" -lt "$relayed" ]; then
      args+=(--next-via "ws://127.0.0.1:$relay_port/edge/b$relayed-$i")
    else
      args+=(--next "127.0.0.1:$((base + next))")
    fi
    if [ "$prev" -lt "$relayed" ]; then
      args+=(--pred-via "ws://127.0.0.1:$relay_port/edge/b$relayed-$prev")
    fi
    $bin "${args[@]}" &
    pids+=($!)
  done
  echo "== 3 stages, $relayed of 3 links relayed"
  $bin bench --ring "127.0.0.1:$base" --ring-secret-file "$work/secret" "$@"
  stop
  base=$((base + 3))
done
