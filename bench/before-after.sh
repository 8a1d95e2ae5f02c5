#!/usr/bin/env bash
# Prefill and decode speed of two kvasir binaries side by side (a change's before and after), on
# the 8-layer TinyLlama-shaped bench models, the two binaries alternating in one sitting so that
# the host's drift hits both alike. Flags every cell where the second binary is slower than the
# first by more than the allowed share and then exits 1.
#
# Usage: bench/before-after.sh BEFORE AFTER [TYPES] [THREADS] [ROUNDS] [MAX_SLOWER]
#   BEFORE, AFTER  two kvasir binaries (e.g. one built from main in a copy of the tree)
#   TYPES          file types, default "q4_0 q4_k_m"
#   THREADS        thread counts, default "1 2"
#   ROUNDS         alternations per (type, threads), default 4; each runs `bench -r 3` of both
#   MAX_SLOWER     allowed slowdown of a median, default 0.03 (3 %)
# Extra flags for both binaries' `kvasir bench` (e.g. --backend cpu for an AFTER that has it) go in
# KVASIR_BENCH_FLAGS_BEFORE and KVASIR_BENCH_FLAGS_AFTER. Models are written with AFTER's
# `kvasir synth` into build/bench-models (or $KVASIR_BENCH_MODELS) when missing.
# Prints a markdown table of medians over all samples (ROUNDS x 3 per binary and cell).
set -euo pipefail
. "$(dirname "$0")/bench-models.sh"
cd "$(dirname "$0")/.."
before=${1:?usage: $0 BEFORE AFTER [TYPES] [THREADS] [ROUNDS] [MAX_SLOWER]}
after=${2:?usage: $0 BEFORE AFTER [TYPES] [THREADS] [ROUNDS] [MAX_SLOWER]}
types=${3:-q4_0 q4_k_m}
threads=${4:-1 2}
rounds=${5:-4}
max_slower=${6:-0.03}
models=${KVASIR_BENCH_MODELS:-build/bench-models}
read -r -a flags_before <<<"${KVASIR_BENCH_FLAGS_BEFORE:-}"
read -r -a flags_after <<<"${KVASIR_BENCH_FLAGS_AFTER:-}"
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT

for t in $types; do bench_model "$after" "$t" >/dev/null; done

for t in $types; do
  m="$models/tinyllama-8l-$t.gguf"
  for th in $threads; do
    for ((r = 0; r < rounds; r++)); do
      # Which binary goes first alternates too: neither always runs on a warmer host.
      if ((r % 2 == 0)); then order="b a"; else order="a b"; fi
      for which in $order; do
        if [ "$which" = b ]; then
          "$before" bench -m "$m" -t "$th" -p 128 -n 64 -r 3 --json "${flags_before[@]}" \
            >"$out/b-$t-$th-$r.json"
        else
          "$after" bench -m "$m" -t "$th" -p 128 -n 64 -r 3 --json "${flags_after[@]}" \
            >"$out/a-$t-$th-$r.json"
        fi
      done
    done
  done
done

python3 - "$out" "$types" "$threads" "$max_slower" <<'EOF'
import glob, json, statistics, sys
out, types, threads, max_slower = sys.argv[1], sys.argv[2].split(), sys.argv[3].split(), float(sys.argv[4])
print("| type | threads | before pp128 | after pp128 | after / before | before tg64 | after tg64 | after / before |")
print("|---|---:|---:|---:|---:|---:|---:|---:|")
slower = []
for t in types:
    for th in threads:
        s = {}
        for which in "ba":
            p, d = [], []
            for f in glob.glob(f"{out}/{which}-{t}-{th}-*.json"):
                j = json.load(open(f))
                p += j["prefill_tokens_per_s"]["samples"]
                d += j["decode_tokens_per_s"]["samples"]
            s[which] = (statistics.median(p), statistics.median(d))
        rp, rd = s["a"][0] / s["b"][0], s["a"][1] / s["b"][1]
        mark = lambda r: f"{r:.3f}" + (" **slower**" if r < 1 - max_slower else "")
        print(f"| {t} | {th} | {s['b'][0]:.1f} | {s['a'][0]:.1f} | {mark(rp)} "
              f"| {s['b'][1]:.1f} | {s['a'][1]:.1f} | {mark(rd)} |")
        slower += [f"{t} -t {th} {name}" for name, r in (("pp128", rp), ("tg64", rd))
                   if r < 1 - max_slower]
if slower:
    print(f"\nslower than before by more than {max_slower:.0%}: " + ", ".join(slower))
    sys.exit(1)
print(f"\nno cell slower than before by more than {max_slower:.0%}")
EOF
