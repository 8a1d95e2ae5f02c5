#!/usr/bin/env bash
# Builds one libFuzzer target with the `fuzz` preset (clang-14, build-fuzz/) and runs it for a
# bounded time on a seed corpus from scripts/fuzz-seeds.sh. Exits non-zero when the fuzzer finds a
# crash, a leak or a timeout; the offending input is kept under build-fuzz/artifacts/FUZZER/.
# Usage: scripts/run-fuzz.sh FUZZER SECONDS      e.g. scripts/run-fuzz.sh gguf_reader_fuzz 60
# Environment: KVASIR_ASSETS (shared assets, default ../shared), KVASIR_FUZZ_JOBS (build jobs),
# KVASIR_FUZZ_MAX_LEN (largest input in bytes, default 65536).
set -euo pipefail
cd "$(dirname "$0")/.."
fuzzer=${1:?usage: $0 FUZZER SECONDS}
seconds=${2:?usage: $0 FUZZER SECONDS}
export KVASIR_ASSETS=${KVASIR_ASSETS:-$(cd .. && pwd)/shared}

cmake --preset fuzz >/dev/null
cmake --build build-fuzz --target "$fuzzer" -j "${KVASIR_FUZZ_JOBS:-$(nproc)}"
bin=$(find build-fuzz -type f -name "$fuzzer" -perm -u+x | head -n 1)
if [ -z "$bin" ]; then
  echo "run-fuzz: no binary for $fuzzer under build-fuzz/" >&2
  exit 1
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
./scripts/fuzz-seeds.sh "$fuzzer" "$work/corpus"
artifacts=build-fuzz/artifacts/$fuzzer
mkdir -p "$artifacts"

log="$artifacts/log.txt"
echo "run-fuzz: $fuzzer for ${seconds}s (log: $log)"
status=0
"$bin" "$work/corpus" \
  -max_total_time="$seconds" \
  -max_len="${KVASIR_FUZZ_MAX_LEN:-65536}" \
  -timeout=10 \
  -rss_limit_mb=2048 \
  -print_final_stats=1 \
  -artifact_prefix="$artifacts/" >"$log" 2>&1 || status=$?
if [ "$status" -ne 0 ]; then
  tail -n 60 "$log" >&2
  echo "run-fuzz: $fuzzer FAILED (exit $status); inputs under $artifacts/" >&2
  exit "$status"
fi
runs=$(awk '/stat::number_of_executed_units/ {print $2}' "$log")
echo "run-fuzz: $fuzzer ok: ${runs:-?} runs in ${seconds}s, no crash"
