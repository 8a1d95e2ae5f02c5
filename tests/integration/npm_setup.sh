#!/usr/bin/env bash
# Installs the npm packages the serve tests use (the `openai` SDK as the client, `ajv` to validate
# structured output against its JSON schema) into DIR, a
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
# openai 4: the major version the tests are written against, and one that runs on Debian's Node.js 18.
major=4
version_of() {
  node -p "JSON.parse(require('fs').readFileSync('$dir/node_modules/$1/package.json')).version" \
    2>/dev/null || true
}
installed=$(version_of openai)
ajv=$(version_of ajv)
if [ "${installed%%.*}" = "$major" ] && [ "${ajv%%.*}" = 8 ]; then
  echo "npm_setup: openai $installed and ajv $ajv already in $dir"
  exit 0
fi
command -v npm >/dev/null || fail "npm is missing (scripts/install-deps.sh --tests installs it)"
mkdir -p "$dir"
[ -f "$dir/package.json" ] || echo '{"name": "kvasir-serve-tests", "private": true}' >"$dir/package.json"
npm install --prefix "$dir" --no-audit --no-fund --loglevel=error "openai@$major" "ajv@8" ||
  fail "npm install openai ajv failed"
echo "npm_setup: installed openai $(version_of openai) and ajv $(version_of ajv) in $dir"
