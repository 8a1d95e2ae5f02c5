#!/usr/bin/env bash
# Benchmarks a local ring of N stages on a model: `kvasir bench -m MODEL --stages N -t THREADS`
# starts the stage processes (even split of the layers, a fresh ring secret and node keys: every
# link authenticated and encrypted, as in production), runs the ring bench on them (see
# `kvasir bench --ring`) and stops them.
# Usage: bench/ring-bench.sh MODEL STAGES THREADS_PER_STAGE [bench flags...]
# Example: bench/ring-bench.sh build/bench-models/tinyllama-8l-q4_0.gguf 2 1 --streams 1,4,16 -n 64 -p 128
# Slow links: --hop-delay-ms D [--hop-jitter-ms J] [--hop-jitter uniform|normal] [--hop-mbps B] put
# a delaying proxy on every link (stage i -> stage i + 1), D ms one way per hop.
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: $0 MODEL STAGES THREADS [bench flags]}
stages=${2:?}
threads=${3:?}
shift 3
bin=${KVASIR_BIN:-./build/bin/kvasir}
exec "$bin" bench -m "$model" --stages "$stages" -t "$threads" "$@"
