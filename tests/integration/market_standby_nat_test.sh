#!/usr/bin/env bash
# Standbys through the market and the relay (docs/MARKET.md, "Standbys"), with real network
# isolation: "pub" (the market over HTTPS, the relay, nginx serving the model file, three `kvasir
# join` nodes) and "phone" (a `kvasir join --behind-nat --standby` node behind a simulated carrier
# NAT that drops every new inbound TCP connection). The three nodes form a ring; the phone stands
# by for window 1 or 2 and reaches the ring only through the relay. While 8 `generate --market`
# clients stream 240 tokens each (even ones greedy, odd ones seeded at temperature 0.9), the
# holder of the phone's window is killed with kill -9: the phone's standby takes its place through
# its relay edges, every client prints exactly what `generate -m` prints for the same seed, and the
# head's log gives each session's pause. Once the dead node's lease lapses, the phone's claim is
# the window's and the ring is ready again. Then the other way round: the phone, holding that
# window and reached only through the relay, is killed with kill -9 under 8 more streaming sessions,
# and a public `join --standby` node takes its window the same way.
# Usage: market_standby_nat_test.sh KVASIR_BINARY ASSETS_DIR. Exit 77 (skip) as nat_test.sh.
set -uo pipefail
bin=${1:?usage: $0 KVASIR_BINARY ASSETS_DIR}
assets=${KVASIR_ASSETS:-${2:?usage: $0 KVASIR_BINARY ASSETS_DIR}}
model="$assets/models/stories260K.gguf"
pids=()
# shellcheck source=netns_lib.sh
source "$(dirname "$0")/netns_lib.sh"
# shellcheck source=market_lib.sh
source "$(dirname "$0")/market_lib.sh"

require_netns nft "nftables (nft)"
command -v nginx >/dev/null || missing "nginx is not installed"
command -v curl >/dev/null || missing "curl is not installed"
command -v python3 >/dev/null || missing "python3 is not installed"

market_hosts sp 79
lease=8
start_market
join_flags=(--link-timeout 2 --repair-timeout 20)

# Reads ring 0 of the map with a Python expression over `r` (the ring) and prints its value.
ring_py() { map | python3 -c "import json,sys; r=json.load(sys.stdin)['models'][0]['rings'][0]; print($1)"; }
ring_ready() { [ "$(ring_py "r['ready']")" = True ]; }
join a "$pub" --listen 10.79.0.1:0
join b "$pub" --listen 10.79.0.1:0
join c "$pub" --listen 10.79.0.1:0
wait_for 60 "three nodes form a ready ring" ring_ready
join phone "$phone" --behind-nat --standby
# Ready, and checked: the market dialed it through the relay (a standby is promoted only then).
standby_ready() {
  [ "$(ring_py "[w['window'] for w in r['windows'] if [s for s in w['standbys'] if s['ready'] and s['checked']]]")" != "[]" ] &&
    ring_ready
}
wait_for 60 "the phone stands by, ready" standby_ready
window=$(ring_py "[w['window'] for w in r['windows'] if w['standbys']][0]")
standby_claim=$(ring_py "r['windows'][$window]['standbys'][0]['claim']")
victim_key=$(ring_py "r['windows'][$window]['holder']")
[ "$(ring_py "r['windows'][$window]['standbys'][0]['node']")" = "$(node_key phone)" ] ||
  die "the standby of window $window is not the phone"
grep -q "market: checked claim $standby_claim ([0-9a-f]* at wss://10.79.0.1:8443/edge/" "$work/market.log" ||
  die "the market did not check the phone through the relay"
victim=""
for n in a b c; do [ "$(node_key $n)" = "$victim_key" ] && victim=$n; done
[ -n "$victim" ] || die "no node holds window $window"
head_key=$(ring_py "r['windows'][0]['holder']")
head=""
for n in a b c; do [ "$(node_key $n)" = "$head_key" ] && head=$n; done
echo "the phone (behind NAT) stands by for window $window, held by node $victim; the head is node $head"
# The neighbours of the window know the standby from their heartbeats.
knows() { grep -q "1 standby(s) of the successor's window\|1 of the predecessor's" "$work/join-$1.log"; }
for n in a b c; do
  [ "$n" = "$victim" ] && continue
  wait_for 20 "node $n learns the standby" knows $n
done

prompts=("Once upon a time" "The little dog" "Lily went to the park" "One day, a bird")
sampling() {  # sampling I: the flags of client I
  if [ $(($1 % 2)) -eq 0 ]; then echo "--temp 0"; else echo "--temp 0.9 --top-k 20 --seed $((1000 + $1))"; fi
}
for i in $(seq 0 7); do
  # shellcheck disable=SC2046
  "$bin" generate -m "$model" -p "${prompts[$((i % 4))]}" -n 240 --ignore-eos -t 1 $(sampling $i) \
    >"$work/want-$i.txt" 2>/dev/null || fail "single-process generate $i failed"
done
# stream_and_kill VICTIM: 8 clients stream through the market; VICTIM's node is killed with kill -9
# while every one is mid-stream; every client must print its single-process text, and the head must
# resume 8 more sessions after a pause (printed).
round=0
stream_and_kill() {
  local victim=$1 i
  round=$((round + 1))
  local pauses_before
  pauses_before=$(grep -c "resumed after a pause" "$work/join-$head.log")
  # The clients wait at a gate, so that they start together (each session is over within seconds).
  local client_pids=()
  for i in $(seq 0 7); do
    # shellcheck disable=SC2046,SC2016
    ip netns exec "$pub" bash -c 'while [ ! -e "$0" ]; do sleep 0.005; done; shift; exec "$@"' \
      "$work/go-$round" - "$bin" generate --market "$market_url" --ca "$work/cert.pem" \
      --model stories260K --market-wait 30 -p "${prompts[$((i % 4))]}" -n 240 --ignore-eos \
      $(sampling $i) >"$work/got-$round-$i.txt" 2>"$work/client-$round-$i.log" &
    client_pids+=($!)
    pids+=($!)
  done
  touch "$work/go-$round"
  streaming() {  # every client has printed text past its prompt
    for i in $(seq 0 7); do
      [ "$(stat -c %s "$work/got-$round-$i.txt")" -gt $((${#prompts[$((i % 4))]} + 1)) ] || return 1
    done
  }
  # Polled tightly: a session of this tiny model is over within seconds.
  for _ in $(seq 3000); do streaming && break; sleep 0.01; done
  streaming || die "the 8 clients do not stream"
  kill -9 "$(eval echo "\$pid_$victim")"
  for i in $(seq 0 7); do  # each was mid-stream when the node died
    [ "$(stat -c %s "$work/got-$round-$i.txt")" -lt "$(stat -c %s "$work/want-$i.txt")" ] ||
      die "client $i had finished before node $victim was killed"
  done
  echo "node $victim (window $window) killed with kill -9 while 8 sessions stream"
  local failed=0
  for i in $(seq 0 7); do
    wait "${client_pids[$i]}" ||
      { echo "client $i exited with an error: $(tail -n 3 "$work/client-$round-$i.log")"; failed=1; }
    if ! cmp -s "$work/want-$i.txt" "$work/got-$round-$i.txt"; then
      echo "client $i differs from one process:"; echo "want: $(cat "$work/want-$i.txt")"
      echo "got:  $(cat "$work/got-$round-$i.txt")"
      failed=1
    fi
  done
  [ $failed -eq 0 ] || die "a client lost something when node $victim died"
  echo "every client printed exactly its single-process text; pauses the head saw:"
  grep -o "session [0-9]* resumed after a pause of [0-9]* ms" "$work/join-$head.log" |
    tail -n +$((pauses_before + 1)) | sed 's/^/  /'
  [ "$(grep -c "resumed after a pause" "$work/join-$head.log")" -ge $((pauses_before + 8)) ] ||
    die "the head replayed fewer than 8 sessions"
}
stream_and_kill "$victim"
grep -q "adopted by a predecessor" "$work/join-phone.log" || die "the phone was never adopted"
grep -q "paired" "$work/relay.log" || die "the relay paired no edge: the phone was not reached through it"
promoted() { [ "$(ring_py "r['windows'][$window].get('claim')")" = "$standby_claim" ] && ring_ready; }
wait_for $((3 * lease + 30)) "the phone's standby claim becomes window $window's claim" promoted
echo "after the lease ($lease s): the phone's claim $standby_claim holds window $window, and the ring is ready"

# The other way round: the phone holds window $window now, and reaches the ring only through the
# relay (its predecessor's edge is relayed; its stage kept running when promoted). Two public
# standbys cover both non-head windows (a standby goes where there are fewest), so one stands by
# for the phone's; 8 more sessions stream, and the phone is killed with kill -9.
join d "$pub" --listen 10.79.0.1:0 --standby
join e "$pub" --listen 10.79.0.1:0 --standby
two_standbys() {
  [ "$(ring_py "sum(1 for w in r['windows'] for s in w['standbys'] if s['ready'] and s['checked'])")" = 2 ] &&
    ring_ready
}
wait_for 60 "two public nodes stand by, ready" two_standbys
phone_standby=$(ring_py "r['windows'][$window]['standbys'][0]['node']")
replacement=""
for n in d e; do [ "$(node_key $n)" = "$phone_standby" ] && replacement=$n; done
[ -n "$replacement" ] || die "no public node stands by for the phone's window $window"
# The phone's neighbours list its standby: the last count each logged names it.
counts() {  # counts NODE: "N M" from the node's last standby line (successor's, predecessor's)
  grep -o "[0-9]* standby(s) of the successor's window, [0-9]* of the predecessor's" \
    "$work/join-$1.log" | tail -n 1 | sed 's/ standby(s) of the successor.s window, / /; s/ of.*//'
}
knows_next() { set -- $(counts "$1"); [ "${1:-0}" -ge 1 ]; }
knows_pred() { set -- $(counts "$1"); [ "${2:-0}" -ge 1 ]; }
pred_key=$(ring_py "r['windows'][$((window - 1))]['holder']")
next_key=$(ring_py "r['windows'][$(((window + 1) % 3))]['holder']")
for n in a b c; do
  [ "$n" = "$victim" ] && continue
  [ "$(node_key $n)" = "$pred_key" ] && wait_for 20 "node $n (before the phone) learns its standby" knows_next $n
  [ "$(node_key $n)" = "$next_key" ] && wait_for 20 "node $n (after the phone) learns its standby" knows_pred $n
done
echo "node $replacement stands by for the phone's window $window"
stream_and_kill phone
grep -q "adopted by a predecessor" "$work/join-$replacement.log" || die "node $replacement was never adopted"
promoted() { [ "$(ring_py "r['windows'][$window].get('holder')")" = "$phone_standby" ] && ring_ready; }
wait_for $((3 * lease + 30)) "node $replacement's standby claim becomes window $window's claim" promoted
echo "after the lease ($lease s): node $replacement holds window $window, and the ring is ready"
echo "PASS"
