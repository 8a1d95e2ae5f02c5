#!/usr/bin/env bash
# Loads a page (the market's live page, GET /) in headless Chromium and keeps what a person would
# have seen: OUT_DIR/page.html, the DOM after the page's scripts ran (--dump-dom), and
# OUT_DIR/market-page.png, a 1280x900 screenshot. The caller asserts on page.html (grep for
# `data-loaded="1"`, `class="window"` cells and their data-* attributes).
# Usage: page_check.sh URL OUT_DIR   (or source it and call page_check URL OUT_DIR)
# Exit 0 when both files were written, 1 when Chromium failed or timed out, 77 (skip) when
# Chromium is not installed, unless KVASIR_REQUIRE_ASSETS=1 (CI), which makes that a failure.
# CHROMIUM picks the binary (default: chromium, Debian's package); PAGE_CHECK_TIMEOUT the seconds
# each Chromium run may take (default 60).
#
# How it waits for the page (found with Debian's Chromium 156, whose --headless is the new
# headless mode):
# - --virtual-time-budget=8000 runs the page on virtual time: timers fire as soon as nothing else
#   is pending, and the clock stops while a network fetch is in flight. So the dump comes after
#   8 virtual seconds of the page's life (four 2-second polls of /v1/map and /v1/balances), each
#   fetch answered, however slow the market is: no real-time sleep, no race with the first poll.
#   --run-all-compositor-stages-before-draw is not needed for the DOM (the DOM is dumped after
#   the budget expires); the screenshot is taken after the budget too.
# - The other side of that clock: a fetch that is never answered stops virtual time for good, and
#   the page's own fetch timeout (a timer) never fires, so Chromium would wait forever (--timeout
#   does not help once the page has loaded). Hence the hard `timeout` around each run.
# - Debian's launcher (/usr/bin/chromium) may print "[: NNN: unexpected operator" when /dev/shm is
#   mounted twice (containers) and then skips its --disable-dev-shm-usage guard; we pass that flag
#   ourselves, since a container's /dev/shm is often too small for Chromium. Its dbus errors on
#   stderr are harmless; stderr goes to OUT_DIR/chromium-*.log.
# - Each run gets its own fresh profile (--user-data-dir), so parallel tests do not fight over the
#   profile lock and nothing is read from or written to $HOME.

page_check() {
  local url=${1:?usage: page_check.sh URL OUT_DIR} out=${2:?usage: page_check.sh URL OUT_DIR}
  local chromium=${CHROMIUM:-chromium} limit=${PAGE_CHECK_TIMEOUT:-60}
  if ! command -v "$chromium" >/dev/null; then
    echo "page_check: $chromium is not installed (apt-get install chromium, or set CHROMIUM)" >&2
    if [ "${KVASIR_REQUIRE_ASSETS:-0}" = 1 ]; then return 1; fi
    return 77
  fi
  mkdir -p "$out" || { echo "page_check: cannot create $out" >&2; return 1; }
  local profile
  profile=$(mktemp -d "${TMPDIR:-/tmp}/page-check-profile.XXXXXX") || return 1
  local common=(--headless --no-sandbox --disable-gpu --disable-dev-shm-usage --no-first-run
    --no-default-browser-check --user-data-dir="$profile" --virtual-time-budget=8000)
  local rc=0
  rm -f "$out/page.html" "$out/market-page.png"
  timeout -k 5 "$limit" "$chromium" "${common[@]}" --dump-dom "$url" \
    >"$out/page.html" 2>"$out/chromium-dom.log" || rc=$?
  if [ $rc -eq 0 ]; then
    timeout -k 5 "$limit" "$chromium" "${common[@]}" --screenshot="$out/market-page.png" \
      --window-size=1280,900 "$url" >"$out/chromium-screenshot.log" 2>&1 || rc=$?
  fi
  rm -rf "$profile"
  if [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
    echo "page_check: chromium ran past ${limit}s on $url (a request the page made was never" \
      "answered?); logs in $out/chromium-*.log" >&2
    return 1
  fi
  if [ $rc -ne 0 ]; then
    echo "page_check: chromium failed (exit $rc) on $url; logs in $out/chromium-*.log:" >&2
    grep -v -e dbus -e 'unexpected operator' "$out"/chromium-*.log | tail -n 5 >&2
    return 1
  fi
  if ! grep -q '</html>' "$out/page.html"; then
    # A page that does not load (connection refused, HTTP error without a body) still exits 0.
    local why
    why=$(grep -o 'Page load failed.*' "$out/chromium-dom.log" | head -n 1)
    echo "page_check: chromium wrote no DOM for $url: ${why:-see $out/chromium-dom.log}" >&2
    return 1
  fi
  if [ ! -s "$out/market-page.png" ]; then
    echo "page_check: chromium wrote no screenshot for $url (see $out/chromium-screenshot.log)" >&2
    return 1
  fi
  echo "page_check: $url -> $out/page.html ($(grep -o 'class="window"' "$out/page.html" | wc -l)" \
    "window cells), $out/market-page.png"
}

# Run as a script (not sourced): check the page given on the command line.
if [ "${BASH_SOURCE[0]}" = "$0" ]; then
  page_check "$@"
  exit $?
fi
