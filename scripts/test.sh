#!/usr/bin/env bash
# Installs dependencies, builds, and runs every test: each libFuzzer target for a bounded time, then
# the GoogleTest suites through CTest. Exit status is non-zero if anything fails.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/install-deps.sh
cmake --preset release
cmake --build --preset release -j "$(nproc)"

# Fuzzers (clang-14 + libFuzzer), each for KVASIR_FUZZ_SECONDS (default 20).
for target in gguf_reader_fuzz tokenizer_fuzz bpe_tokenizer_fuzz frame_decoder_fuzz url_fuzz \
  http_response_fuzz relay_hello_fuzz relay_request_fuzz handshake_fuzz link_probe_fuzz \
  plan_files_fuzz receipt_fuzz market_api_fuzz grammar_fuzz; do
  ./scripts/run-fuzz.sh "$target" "${KVASIR_FUZZ_SECONDS:-20}"
done

ctest --preset release -j "$(nproc)"
