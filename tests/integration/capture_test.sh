#!/usr/bin/env bash
# What an eavesdropper on the path sees. Two network namespaces joined by a veth pair: host "a"
# runs the head and the last stage of a 3-stage stories260K ring, a relay (plain ws://, so that
# the relay's own framing is visible and the operator's view is what is captured) and the client;
# host "b" runs the middle stage, whose predecessor link goes through the relay and whose
# successor link is direct TCP across the veth. tcpdump captures every interface of host "a"
# while a generation runs. The capture must hold the traffic (the WebSocket upgrade and every
# link's HANDSHAKE frames are visible in it) but neither the prompt nor any word of the generated
# text, and no frame header but HANDSHAKE: stage links carry floats and ids, which no text search
# would notice, so every frame after the handshake must be sealed (frame_scan.py). The scan is
# first shown to find a frame sent in the clear, in a synthetic one.
# Usage: capture_test.sh KVASIR_BINARY ASSETS_DIR. Exit 77 (skip) without root, namespaces, the
# model, ip, tcpdump or python3, unless KVASIR_REQUIRE_ASSETS=1 (CI), where each of those fails.
set -uo pipefail
bin=${1:?usage: $0 KVASIR_BINARY ASSETS_DIR}
assets=${KVASIR_ASSETS:-${2:?usage: $0 KVASIR_BINARY ASSETS_DIR}}
model="$assets/models/stories260K.gguf"
pids=()
# shellcheck source=netns_lib.sh
source "$(dirname "$0")/netns_lib.sh"
require_netns tcpdump "tcpdump"
command -v python3 >/dev/null || missing "python3 is not installed"
scan="$(dirname "$0")/frame_scan.py"

tag=$$
na=kv-a-$tag
nb=kv-b-$tag
two_hosts "$na" "$nb" 78 "ca$tag" "cb$tag"

head -c 32 /dev/urandom >"$work/secret"
export XDG_STATE_HOME="$work/state"
common=(-t 1 -c 256 --ring-secret-file "$work/secret" --log-level info)
ip netns exec "$na" tcpdump -i any -U --immediate-mode -B 16384 -s 0 -w "$work/capture.pcap" 2>"$work/tcpdump.log" &
pids+=($!)
tcpdump_pid=$!
for _ in $(seq 50); do grep -q "listening on" "$work/tcpdump.log" && break; sleep 0.1; done
grep -q "listening on" "$work/tcpdump.log" || fail "tcpdump did not start: $(cat "$work/tcpdump.log")"

relay="ws://10.78.0.1:8080/edge"
ip netns exec "$na" "$bin" relay --listen 10.78.0.1:8080 --secret-file "$work/secret" \
  2>"$work/relay.log" &
pids+=($!)
ip netns exec "$na" "$bin" stage -m "$model" --layers 0:2 --listen 10.78.0.1:7000 \
  --next-via "$relay/cap-$tag-01" --name head "${common[@]}" 2>"$work/stage0.log" &
pids+=($!)
ip netns exec "$nb" "$bin" stage -m "$model" --layers 2:4 --listen 10.78.0.2:7001 \
  --pred-via "$relay/cap-$tag-01" --next 10.78.0.1:7002 --name middle "${common[@]}" \
  2>"$work/stage1.log" &
pids+=($!)
ip netns exec "$na" "$bin" stage -m "$model" --layers 4:5 --listen 10.78.0.1:7002 \
  --next 10.78.0.1:7000 --name tail "${common[@]}" 2>"$work/stage2.log" &
pids+=($!)

prompt="Once upon a time, in a quiet harbor town"
want=$("$bin" generate -m "$model" -p "$prompt" -n 48 --temp 0 -t 1 2>/dev/null) ||
  fail "single-process generate failed"
got=$(ip netns exec "$na" "$bin" generate --ring 10.78.0.1:7000 --ring-secret-file "$work/secret" \
  -p "$prompt" -n 48 --temp 0 2>"$work/client.log")
status=$?
if [ $status -ne 0 ] || [ "$got" != "$want" ]; then
  for f in client relay stage0 stage1 stage2; do echo "--- $f.log"; tail -n 20 "$work/$f.log"; done
  fail "the ring did not reproduce the single-process text (exit $status): '$got'"
fi
# Everything the ring sent is in the file once a marker sent after it is: tcpdump writes packets in
# the order it sees them (-U), so wait for a UDP datagram sent now to show up, then stop it.
marker="kvasir-capture-end-$tag"
ip netns exec "$na" bash -c "echo $marker >/dev/udp/10.78.0.1/9" || fail "cannot send the end marker"
for _ in $(seq 100); do
  grep -aqF "$marker" "$work/capture.pcap" && break
  sleep 0.1
done
grep -aqF "$marker" "$work/capture.pcap" || fail "tcpdump did not write the end marker within 10 s"
kill -INT "$tcpdump_pid"
wait "$tcpdump_pid" 2>/dev/null
size=$(stat -c %s "$work/capture.pcap")
[ "$size" -gt 20000 ] || fail "the capture holds only $size bytes: it did not see the ring"
# The capture does see application bytes: the relay's HTTP upgrade travels in the clear.
grep -aq "GET /edge/cap-$tag-01" "$work/capture.pcap" ||
  fail "the WebSocket upgrade is not in the capture: it would not show plaintext either ($(tr "\n" " " <"$work/tcpdump.log"))"
leaks=0
for needle in "$prompt" "quiet harbor" "Once upon"; do
  if grep -aqF "$needle" "$work/capture.pcap"; then echo "LEAK: '$needle'"; leaks=1; fi
done
# Every word of 5 or more letters of the generated text.
for word in $(echo "$got" | tr -cs 'A-Za-z' '\n' | awk 'length($0) >= 5' | sort -u); do
  if grep -aqF "$word" "$work/capture.pcap"; then echo "LEAK: generated word '$word'"; leaks=1; fi
done
[ $leaks -eq 0 ] || fail "prompt or generated text appears in the captured traffic"

# Frame headers in the clear. The scan finds one that a link would send unsealed...
python3 "$scan" --synthetic "$work/plain-frame.bin" || fail "frame_scan.py cannot write its synthetic frame"
cat "$work/capture.pcap" "$work/plain-frame.bin" >"$work/capture-plus-plain.pcap"
# (All of the scan's output first: grep -q would close the pipe at its match, under pipefail.)
scanned=$(python3 "$scan" "$work/capture-plus-plain.pcap")
grep -q "^5 HIDDEN 1$" <<<"$scanned" || fail "frame_scan.py misses a HIDDEN frame in the clear: $scanned"
# ...and in the capture sees every link's handshake (4 frames each: 3 stage links, 1 client at
# least) but no other frame.
frames=$(python3 "$scan" "$work/capture.pcap") || fail "frame_scan.py failed"
echo "frame headers in the clear:" $frames
handshakes=$(echo "$frames" | awk '$2 == "HANDSHAKE" {print $3}')
[ "${handshakes:-0}" -ge 16 ] || fail "only ${handshakes:-0} HANDSHAKE frames in the capture (want >= 16): it did not see every link"
others=$(echo "$frames" | awk '$2 != "HANDSHAKE" && NF == 3')
[ -z "$others" ] || fail "frames other than HANDSHAKE travel in the clear: $others"
echo "captured $size bytes on host a (veth, loopback, relay): no prompt text, no token text, no frame but HANDSHAKE in the clear"
echo "PASS"
