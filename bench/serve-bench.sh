#!/usr/bin/env bash
# Time to first token and tokens/s through `kvasir serve` against the same ring used directly by
# `kvasir generate --ring`, for several numbers of concurrent clients (bench/serve_load.py). Starts a
# ring of STAGES stages (THREADS each) on the model and `kvasir serve --ring` in front of it, then
# for each client count runs the API round and the direct round, REPS times each, alternating, and
# prints the median of each figure as a markdown table.
# Usage: bench/serve-bench.sh MODEL [STAGES=3] [THREADS=1] [CLIENTS=1,8,32] [N=64] [REPS=3]
set -euo pipefail
cd "$(dirname "$0")/.."
model=${1:?usage: $0 MODEL [STAGES] [THREADS] [CLIENTS] [N] [REPS]}
stages=${2:-3}
threads=${3:-1}
clients=${4:-1,8,32}
n=${5:-64}
reps=${6:-3}
bin=${KVASIR_BIN:-./build/bin/kvasir}
work=$(mktemp -d)
n_layer=$($bin inspect "$model" | awk '/\.block_count/ {print $3; exit}')
base=$((19000 + RANDOM % 2000))
pids=()
cleanup() { kill "${pids[@]}" 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$work/secret"
chmod 600 "$work/secret"
for ((i = 0; i < stages; i++)); do
  $bin stage -m "$model" --layers "$((i * n_layer / stages)):$(((i + 1) * n_layer / stages))" \
    --listen "127.0.0.1:$((base + i))" --next "127.0.0.1:$((base + (i + 1) % stages))" \
    --name "stage$i" -t "$threads" --max-sessions 128 --log-level error \
    --ring-secret-file "$work/secret" --key "$work/stage$i.key" &
  pids+=($!)
done
$bin serve --ring "127.0.0.1:$base" --ring-secret-file "$work/secret" --listen 127.0.0.1:0 \
  --max-sessions 64 --log-level warn 2>"$work/serve.log" &
pids+=($!)
url=
for _ in $(seq 1 600); do
  url=$(grep -o 'listening on [0-9.]*:[0-9]*' "$work/serve.log" | awk '{print "http://" $3}') || true
  [ -n "$url" ] && curl -sf "$url/health" >/dev/null && break
  sleep 0.1
done
curl -sf "$url/health" >/dev/null || { echo "serve-bench: the ring did not come up" >&2; exit 1; }
# One warm-up round through each path.
python3 bench/serve_load.py api "$url" 1 8 >/dev/null
python3 bench/serve_load.py ring "$bin" "127.0.0.1:$base" "$work/secret" 1 8 >/dev/null

median() { sort -n | awk '{a[NR] = $1} END {print (NR % 2) ? a[(NR + 1) / 2] : (a[NR / 2] + a[NR / 2 + 1]) / 2}'; }
echo "| clients | path | TTFT median (ms) | TTFT max (ms) | per-stream decode t/s | aggregate t/s |"
echo "|---:|---|---:|---:|---:|---:|"
for c in ${clients//,/ }; do
  for path in api ring; do : >"$work/$path.jsonl"; done
  for ((r = 0; r < reps; r++)); do
    python3 bench/serve_load.py api "$url" "$c" "$n" >>"$work/api.jsonl"
    python3 bench/serve_load.py ring "$bin" "127.0.0.1:$base" "$work/secret" "$c" "$n" >>"$work/ring.jsonl"
  done
  for path in api ring; do
    col() { python3 -c "import json,sys; [print(json.loads(l)['$1']) for l in open('$work/$path.jsonl')]" | median; }
    label=$([ $path = api ] && echo "kvasir serve" || echo "generate --ring")
    printf "| %s | %s | %.0f | %.0f | %.1f | %.1f |\n" "$c" "$label" "$(col ttft_ms_median)" \
      "$(col ttft_ms_max)" "$(col decode_tps_median)" "$(col aggregate_tps)"
  done
done
