#!/usr/bin/env bash
# Instructions executed by two kvasir binaries (a change's before and after) on a short greedy
# decode, under valgrind's callgrind: repeatable where wall-clock time on a shared host is not.
# Valgrind reports no AVX-512, so both run their AVX2 kernels; the count measures what a change
# adds around the kernels, not the kernels' speed on this host.
#
# Usage: bench/callgrind-compare.sh BEFORE AFTER [TYPES] [TOKENS]
#   TYPES   bench model file types, default "q4_0 q4_k_m" (written as bench/before-after.sh does)
#   TOKENS  tokens generated after the prompt "Once upon a time", default 16 (one thread)
# Prints one line per type: both counts and AFTER / BEFORE; the generated texts must be equal.
set -euo pipefail
. "$(dirname "$0")/bench-models.sh"
cd "$(dirname "$0")/.."
before=${1:?usage: $0 BEFORE AFTER [TYPES] [TOKENS]}
after=${2:?usage: $0 BEFORE AFTER [TYPES] [TOKENS]}
types=${3:-q4_0 q4_k_m}
tokens=${4:-16}
out=$(mktemp -d)
trap 'rm -rf "$out"' EXIT
for t in $types; do
  m=$(bench_model "$after" "$t")
  for which in before after; do
    bin=$before
    [ "$which" = after ] && bin=$after
    valgrind --tool=callgrind --callgrind-out-file="$out/$which.$t.cg" "$bin" generate -m "$m" \
      -p "Once upon a time" -n "$tokens" --temp 0 --ignore-eos -t 1 >"$out/$which.$t.txt" \
      2>"$out/$which.$t.err"
  done
  count() { sed -n 's/.*Collected : \([0-9]*\).*/\1/p' "$out/$1.$t.err"; }
  b=$(count before)
  a=$(count after)
  same=same
  cmp -s "$out/before.$t.txt" "$out/after.$t.txt" || same=DIFFERENT
  python3 -c "print(f'$t: before {$b:,} after {$a:,} instructions: after / before {$a / $b:.5f}; text $same')"
done
