#!/usr/bin/env bash
# Installs what the tests need, builds every target (the `kvasir` binary, the test suites, the
# benchmarks), runs each libFuzzer target for a bounded time, then the CTest suites, and prints a
# summary: counts, and every skipped or failed test by name. Exit status is non-zero if anything
# fails or if a test is skipped that tests/expected_skips.txt does not list.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh --tests
cmake --preset release -DKVASIR_BUILD_TESTS=ON
cmake --build --preset release -j "$(nproc)"

# Fuzzers (clang-14 + libFuzzer), each for KVASIR_FUZZ_SECONDS (default 20).
for target in gguf_reader_fuzz tokenizer_fuzz bpe_tokenizer_fuzz frame_decoder_fuzz url_fuzz \
  http_response_fuzz relay_hello_fuzz relay_request_fuzz handshake_fuzz link_probe_fuzz \
  plan_files_fuzz receipt_fuzz market_api_fuzz client_record_fuzz grammar_fuzz serve_request_fuzz; do
  ./scripts/run-fuzz.sh "$target" "${KVASIR_FUZZ_SECONDS:-20}"
done

junit=build/ctest-junit.xml
rm -f "$junit"
status=0
ctest --preset release -j "$(nproc)" --no-tests=error --output-junit "$PWD/$junit" || status=$?
[ -f "$junit" ] || { echo "test.sh: ctest wrote no $junit (exit $status)" >&2; exit 1; }
python3 scripts/test_summary.py "$junit" tests/expected_skips.txt || status=1
exit "$status"
