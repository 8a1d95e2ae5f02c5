#!/usr/bin/env bash
# Benchmarks a local ring of N stages on a model: starts the stages, runs `kvasir bench --ring`,
# stops them. Usage: bench/ring-bench.sh MODEL STAGES THREADS_PER_STAGE [bench flags...]
# Example: bench/ring-bench.sh build/bench/tinyllama-8l-q4_0.gguf 2 1 --streams 1,4,16 -n 64 -p 128
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: $0 MODEL STAGES THREADS [bench flags]}
stages=${2:?}
threads=${3:?}
shift 3
bin=${KVASIR_BIN:-./build/bin/kvasir}
work=$(mktemp -d)
n_layer=$($bin inspect "$model" | awk '/\.block_count/ {print $3; exit}')
base=$((17000 + RANDOM % 2000))
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
# A fresh ring secret and node keys: every link is authenticated and encrypted, as in production.
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret"
chmod 600 "$work/secret"
trust() { echo --ring-secret-file "$work/secret" --key "$work/$1.key"; }
for ((i = 0; i < stages; i++)); do
  first=$((i * n_layer / stages))
  last=$(((i + 1) * n_layer / stages))
  next=$(((i + 1) % stages))
  $bin stage -m "$model" --layers "$first:$last" --listen "127.0.0.1:$((base + i))" \
    --next "127.0.0.1:$((base + next))" --name "stage$i" -t "$threads" --log-level error $(trust "stage$i") &
  pids+=($!)
done
$bin bench --ring "127.0.0.1:$base" --ring-secret-file "$work/secret" "$@"
