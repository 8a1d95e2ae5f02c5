#!/usr/bin/env bash
# Prefill and decode speed of `kvasir bench` and llama.cpp's `llama-bench` side by side, on the same
# GGUF files (an 8-layer TinyLlama-shaped model per file type, written by `kvasir synth`), with the
# two alternating in one sitting so that the host's drift hits both alike.
#
# Usage: bench/llamacpp-compare.sh LLAMA_BENCH [TYPES] [THREADS] [ROUNDS]
#   LLAMA_BENCH  path of llama-bench, built outside this repository (docs/PERFORMANCE.md has the recipe)
#   TYPES        file types, default "q4_0 q4_k_m q5_k_m q6_k q8_0 f16"
#   THREADS      thread counts, default "1 2"
#   ROUNDS       alternations per (type, threads), default 2; each runs -r 3 of both tools
# Prints a markdown table: medians over all rounds, and the ratio kvasir / llama.cpp.
set -euo pipefail
. "$(dirname "$0")/bench-models.sh"
cd "$(dirname "$0")/.."
llama_bench=${1:?usage: $0 LLAMA_BENCH [TYPES] [THREADS] [ROUNDS]}
types=${2:-q4_0 q4_k_m q5_k_m q6_k q8_0 f16}
threads=${3:-1 2}
rounds=${4:-2}
bin=${KVASIR_BIN:-./build/bin/kvasir}
models=${KVASIR_BENCH_MODELS:-build/bench-models}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for t in $types; do bench_model "$bin" "$t" >/dev/null; done

for t in $types; do
  m="$models/tinyllama-8l-$t.gguf"
  for th in $threads; do
    for ((r = 0; r < rounds; r++)); do
      "$bin" bench -m "$m" -t "$th" -p 128 -n 64 -r 3 --json >"$out/k-$t-$th-$r.json"
      "$llama_bench" -m "$m" -t "$th" -p 128 -n 64 -r 3 -o json >"$out/l-$t-$th-$r.json" 2>/dev/null
    done
  done
done

python3 - "$out" "$models" "$types" "$threads" <<'EOF'
import glob, json, os, statistics, sys
out, models, types, threads = sys.argv[1], sys.argv[2], sys.argv[3].split(), sys.argv[4].split()
print("| type | size | threads | kvasir pp128 | llama.cpp pp128 | ratio | kvasir tg64 | llama.cpp tg64 | ratio | tg64 GB/s (kvasir) |")
print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
for t in types:
    size = None
    for th in threads:
        kp, kd, lp, ld = [], [], [], []
        for f in glob.glob(f"{out}/k-{t}-{th}-*.json"):
            j = json.load(open(f))
            kp += j["prefill_tokens_per_s"]["samples"]
            kd += j["decode_tokens_per_s"]["samples"]
            size = j["model_bytes"]
        for f in glob.glob(f"{out}/l-{t}-{th}-*.json"):
            for row in json.load(open(f)):
                (lp if row["n_prompt"] > 0 else ld).extend(row["samples_ts"])
        mk = lambda v: statistics.median(v) if v else float("nan")
        print(f"| {t} | {size / 2**20:.0f} MiB | {th} | {mk(kp):.1f} | {mk(lp):.1f} | {mk(kp) / mk(lp):.2f}x "
              f"| {mk(kd):.1f} | {mk(ld):.1f} | {mk(kd) / mk(ld):.2f}x | {mk(kd) * size / 1e9:.1f} |")
EOF
