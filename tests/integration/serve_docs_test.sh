#!/usr/bin/env bash
# Runs every curl example of docs/API.md, as written, against `kvasir serve -m stories260K
# --stages 3 --chat-template chatml` (the command the page starts with): each ```sh block that
# calls curl runs with bash -euo pipefail, with curl failing on an HTTP error (--fail-with-body),
# after the page's address (127.0.0.1:8080) is replaced by the server's (it listens on port 0).
# A block that fails, or a page with fewer than 8 such examples, fails the test.
# Usage: serve_docs_test.sh KVASIR_BINARY ASSETS_DIR API_MD. Exit 77 (skip) without the model or
# curl, a failure instead under KVASIR_REQUIRE_ASSETS=1.
set -uo pipefail
bin=${1:?usage: $0 KVASIR_BINARY ASSETS_DIR API_MD}
assets=${KVASIR_ASSETS:-${2:?usage: $0 KVASIR_BINARY ASSETS_DIR API_MD}}
doc=${3:?usage: $0 KVASIR_BINARY ASSETS_DIR API_MD}
model="$assets/models/stories260K.gguf"
skip() {
  if [ "${KVASIR_REQUIRE_ASSETS:-0}" = 1 ]; then echo "serve_docs_test: $1 (required)"; exit 1; fi
  echo "serve_docs_test: skipped: $1"
  exit 77
}
[ -f "$model" ] || skip "$model is missing"
command -v curl >/dev/null || skip "curl is missing"
work=$(mktemp -d)
pid=
cleanup() {
  [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT
fail() {
  echo "serve_docs_test: $1"
  echo "--- serve log:"; tail -n 30 "$work/serve.log"
  exit 1
}

"$bin" serve -m "$model" --stages 3 --chat-template chatml --listen 127.0.0.1:0 \
  --stats-interval 0.05 2>"$work/serve.log" &
pid=$!
base=
for _ in $(seq 1 1200); do  # 60 s
  base=$(grep -o 'serve: listening on [0-9.]*:[0-9]*' "$work/serve.log" | awk '{print $4}')
  [ -n "$base" ] && break
  kill -0 "$pid" 2>/dev/null || fail "kvasir serve exited"
  sleep 0.05
done
[ -n "$base" ] || fail "kvasir serve did not listen within 60 s"
for _ in $(seq 1 1200); do
  curl -sf "http://$base/health" >/dev/null && break
  sleep 0.05
done
curl -sf "http://$base/health" >/dev/null || fail "the ring did not come up within 60 s"

# The ```sh blocks that call curl, one file each.
python3 - "$doc" "$work" <<'PY' || fail "cannot read $doc"
import re, sys
text = open(sys.argv[1]).read()
blocks = [b for b in re.findall(r"```sh\n(.*?)```", text, re.S) if "curl " in b]
for i, b in enumerate(blocks):
    open(f"{sys.argv[2]}/example{i:02d}.sh", "w").write(b)
PY
n=0
for ex in "$work"/example*.sh; do
  [ -e "$ex" ] || break
  n=$((n + 1))
  script=$(sed "s#127\.0\.0\.1:8080#$base#g" "$ex")
  if ! out=$(bash -euo pipefail -c "curl() { command curl --fail-with-body --max-time 120 \"\$@\"; }
$script" 2>&1); then
    echo "--- example $(basename "$ex"):"; cat "$ex"
    echo "--- output:"; echo "$out"
    fail "a curl example of $doc failed"
  fi
  [ -n "$out" ] || fail "example $(basename "$ex") printed nothing"
  echo "ok $(basename "$ex"): $(head -c 160 <<<"$out" | tr '\n' ' ')"
done
[ "$n" -ge 8 ] || fail "$doc has $n curl examples; expected at least 8"
echo "serve_docs_test: all $n examples ran"
