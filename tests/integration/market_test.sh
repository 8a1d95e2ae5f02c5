#!/usr/bin/env bash
# The market end to end, with real network isolation (docs/MARKET.md). Two network namespaces
# joined by a veth pair: "pub" (a public host: the market over HTTPS, the relay, nginx serving the
# model file, two `kvasir join` nodes) and "phone" (one `kvasir join --behind-nat` node behind a
# simulated carrier NAT that drops every new inbound TCP connection). From an empty map the three
# nodes claim the three windows of stories260K, fetch only their windows over HTTP range requests,
# and form a ring by themselves. Then:
#  - the market dialed and checked the holders it can reach before it called the ring ready;
#  - `kvasir generate --market` prints exactly the text of `kvasir generate -m` for the same seed;
#  - GET /v1/balances shows credit for all three nodes (the phone too) and the receipts behind it,
#    none for more rows than the context;
#  - headless Chromium loads the live page, which shows the ring's windows and their holders (a
#    screenshot is kept in ARTIFACT_DIR);
#  - the market is frozen (SIGSTOP) for twice the lease, as a flood would silence it: no claim is
#    lost, and the ring is ready again as soon as it answers;
#  - the market is killed (kill -9) and restarted after more than a lease: no claim, receipt or
#    balance is lost;
#  - one node is killed (kill -9): its window is uncovered within the lease, a fourth node claims
#    it, and the ring serves the same text again.
# Usage: market_test.sh KVASIR_BINARY ASSETS_DIR [ARTIFACT_DIR]. Exit 77 (skip) as nat_test.sh.
set -uo pipefail
bin=${1:?usage: $0 KVASIR_BINARY ASSETS_DIR [ARTIFACT_DIR]}
assets=${KVASIR_ASSETS:-${2:?usage: $0 KVASIR_BINARY ASSETS_DIR [ARTIFACT_DIR]}}
artifacts=${3:-}
model="$assets/models/stories260K.gguf"
pids=()
# shellcheck source=netns_lib.sh
source "$(dirname "$0")/netns_lib.sh"
# shellcheck source=market_lib.sh
source "$(dirname "$0")/market_lib.sh"
# shellcheck source=page_check.sh
source "$(dirname "$0")/page_check.sh"

require_netns nft "nftables (nft)"
command -v nginx >/dev/null || missing "nginx is not installed"
command -v curl >/dev/null || missing "curl is not installed"

market_hosts m 78
cat "$work/add-model.out"
lease=6
start_market

# The number of windows of ring 0 in `state`.
count_state() { map | grep -o "\"state\":\"$1\"" | wc -l; }
ring_ready() { map | grep -q '"ready":true'; }

join a "$pub" --listen 10.78.0.1:0
join b "$pub" --listen 10.78.0.1:0
join phone "$phone" --behind-nat
wait_for 60 "three nodes form a ready ring" ring_ready
echo "ring formed by itself: $(count_state serving) windows serving"
for n in a b phone; do key=$(node_key $n); [ ${#key} -eq 64 ] || die "no key for node $n"; done
map | grep -q "\"holder\":\"$(node_key phone)\"" || die "the phone holds no window"
# The two holders with addresses were dialed and proved their keys; the phone is not dialed.
[ "$(map | grep -o '"checked":true' | wc -l)" -eq 2 ] || die "the market did not check the two reachable holders"
grep -q "paired" "$work/relay.log" || die "the relay paired no edge: the phone's links are not relayed"

prompt="Once upon a time"
want=$("$bin" generate -m "$model" -p "$prompt" -n 24 --seed 42 -t 1 2>/dev/null) ||
  fail "single-process generate failed"
generate_market() {
  in_pub "$bin" generate --market "$market_url" --ca "$work/cert.pem" --model stories260K \
    --market-wait 60 -p "$prompt" -n 24 --seed 42 2>>"$work/client.log"
}
got=$(generate_market) || die "generate --market failed"
[ "$got" = "$want" ] || { echo "want: $want"; echo "got:  $got"; die "the market's ring differs from one process"; }
echo "generate --market = generate -m: $got"

# The receipt of that session credits all three nodes.
balances_have_all() {
  local b
  b=$(get /v1/balances) || return 1
  for n in a b phone; do echo "$b" | grep -q "\"node\":\"$(node_key $n)\",\"receipts\"" || return 1; done
}
wait_for 20 "credit for all three nodes" balances_have_all
get /v1/balances >"$work/balances.json"
grep -q '"receipts":\[{' "$work/balances.json" || die "no receipt behind the balances"
# No receipt counts more rows than a session can run (the context, 256 here).
for t in $(grep -o '"tokens":[0-9]*' "$work/balances.json" | cut -d: -f2); do
  [ "$t" -ge 1 ] && [ "$t" -le 256 ] || die "a receipt of $t rows was credited (context 256)"
done
echo "balances: $(grep -o '"credit":[0-9.]*' "$work/balances.json" | head -3 | tr '\n' ' ')"

# The live page in a real browser, inside the public host's namespace.
page_out=${artifacts:-$work/page}
# (The market's certificate is this test's own: Chromium is told to take it.)
printf '#!/bin/sh\nexec ip netns exec %s chromium --ignore-certificate-errors "$@"\n' "$pub" >"$work/chromium"
chmod +x "$work/chromium"
command -v chromium >/dev/null || missing "chromium is not installed"
CHROMIUM="$work/chromium" page_check "$market_url/" "$page_out" || {
  rc=$?
  [ $rc -eq 77 ] && skip "chromium is not installed"
  die "the page did not load in chromium"
}
grep -q 'data-loaded="1"' "$page_out/page.html" || die "the page did not render the map"
[ "$(grep -o 'class="window"' "$page_out/page.html" | wc -l)" -eq 3 ] || die "the page does not show 3 windows"
for n in a b phone; do
  grep -q "data-holder=\"$(node_key $n)\"" "$page_out/page.html" || die "the page does not show node $n as a holder"
done
echo "page: 3 windows with their holders; screenshot $page_out/market-page.png"

# The claims as they are: holder and claim id of every window.
claims() { map | grep -o '"claim":[0-9]*\|"holder":"[0-9a-f]*"' | sort; }
claims_before=$(claims)
[ "$(echo "$claims_before" | wc -l)" -eq 6 ] || die "expected 3 claims, got: $claims_before"

# The market frozen for twice the lease (what a flood that lets no heartbeat through does): the
# nodes keep trying, and when it answers again not one claim has expired. The freeze's length is
# the scenario, not a wait for something.
kill -STOP "$market_pid"
sleep $((2 * lease))
kill -CONT "$market_pid"
[ "$(claims)" = "$claims_before" ] || die "claims were lost while the market was frozen: $(claims)"
wait_for 20 "the ring is ready again after the freeze" ring_ready
echo "market frozen for $((2 * lease)) s: no claim lost"

# kill -9 the market, leave it down for more than a lease, start it again on the same database:
# nothing is lost, not even the claims whose leases ran out while it was down.
balances_before=$(get /v1/balances | grep -o '"node":"[0-9a-f]*","receipts":[0-9]*' | sort)
kill -9 "$market_pid"
wait "$market_pid" 2>/dev/null
sleep $((lease + 2))
start_market
[ "$(claims)" = "$claims_before" ] || die "claims were lost in the market's restart: $(claims)"
balances_after=$(get /v1/balances | grep -o '"node":"[0-9a-f]*","receipts":[0-9]*' | sort)
[ "$balances_after" = "$balances_before" ] || die "receipts or balances were lost in the market's restart"
wait_for 20 "the ring is ready again after the restart" ring_ready
echo "market killed (-9), down $((lease + 2)) s and restarted: claims, receipts and balances intact"

# kill -9 node b: its window is uncovered within the lease; a fourth node takes it.
b_key=$(node_key b)
# shellcheck disable=SC2154
kill -9 "$pid_b"
b_gone() { ! map | grep -q "\"holder\":\"$b_key\""; }
wait_for 10 "node b's window is uncovered after kill -9 (lease 6 s)" b_gone
echo "node b killed (-9): its window was freed"
join d "$pub" --listen 10.78.0.1:0
d_holds() { map | grep -q "\"holder\":\"$(node_key d)\""; }
wait_for 30 "node d claims the freed window" d_holds
wait_for 60 "the ring is ready again" ring_ready
got=$(generate_market) || die "generate --market failed after the replacement"
[ "$got" = "$want" ] || { echo "want: $want"; echo "got:  $got"; die "the repaired ring differs from one process"; }
echo "ring repaired by node d: $got"
echo "PASS"
