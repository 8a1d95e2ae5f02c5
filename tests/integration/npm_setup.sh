#!/usr/bin/env bash
# Installs the npm packages the serve tests use as their clients (the `openai` SDK) into DIR, a
# folder under the build tree, once: npm's registry is only asked when DIR lacks them. Exit 77
# (skipped) when npm is missing or the registry cannot be reached, a failure instead under
# KVASIR_REQUIRE_ASSETS=1.
# Usage: npm_setup.sh DIR
set -euo pipefail
dir=${1:?usage: $0 DIR}
fail() {
  if [ "${KVASIR_REQUIRE_ASSETS:-0}" = 1 ]; then
    echo "npm_setup: $1 (required: KVASIR_REQUIRE_ASSETS=1)" >&2
    exit 1
  fi
  echo "npm_setup: skipped: $1" >&2
  exit 77
}
[ -d "$dir/node_modules/openai" ] && { echo "npm_setup: openai already in $dir"; exit 0; }
command -v npm >/dev/null || fail "npm is missing (scripts/install-deps.sh --tests installs it)"
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"name": "kvasir-serve-tests", "private": true}' >"$dir/package.json"
# The major version the tests are written against.
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error openai@7 ||
  fail "npm install openai failed"
version=$(node -p "JSON.parse(require('fs').readFileSync('$dir/node_modules/openai/package.json')).version" 2>/dev/null || echo '?')
echo "npm_setup: installed openai $version in $dir"
