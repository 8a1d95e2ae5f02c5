#!/usr/bin/env bash
# NAT traversal through the relay, with real network isolation. Two network namespaces joined by a
# veth pair: "pub" (a public host: the relay and two stages) and "phone" (one stage behind a
# simulated carrier NAT: an nftables input chain drops every new inbound TCP connection). The test
# shows that a direct connection into the phone fails, then runs a 3-stage ring of stories260K whose
# phone stage has both links relayed over wss (the third link is direct TCP) and checks that it
# generates exactly the single-process tokens.
# Usage: nat_test.sh KVASIR_BINARY ASSETS_DIR. Exit 77 (skip) where namespaces are not permitted
# (not root, or the kernel refuses one) or the model, iproute2 (ip) or nftables (nft) is missing,
# unless KVASIR_REQUIRE_ASSETS=1 (CI): there each of those fails the test, so a CI machine that
# lost one cannot pass it by skipping. Namespaces and processes are removed on every exit path.
set -uo pipefail
bin=${1:?usage: $0 KVASIR_BINARY ASSETS_DIR}
assets=${KVASIR_ASSETS:-${2:?usage: $0 KVASIR_BINARY ASSETS_DIR}}
model="$assets/models/stories260K.gguf"
pids=()
# shellcheck source=netns_lib.sh
source "$(dirname "$0")/netns_lib.sh"

require_netns nft "nftables (nft)"

tag=$$
pub=kv-pub-$tag
phone=kv-phone-$tag
two_hosts "$pub" "$phone" 77 "vp$tag" "vf$tag"
# The phone's NAT: answers to its own connections come in, new inbound connections do not.
carrier_nat "$phone"

make_cert 10.77.0.1
head -c 32 /dev/urandom >"$work/secret"

in_pub() { ip netns exec "$pub" "$@"; }
in_phone() { ip netns exec "$phone" "$@"; }

# The relay and the ring: stage0 (head) and stage2 on the public host, stage1 on the phone.
ip netns exec "$pub" "$bin" relay --listen 10.77.0.1:8443 --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" \
  --secret-file "$work/secret" 2>"$work/relay.log" &
pids+=($!)
relay="wss://10.77.0.1:8443/edge"
export XDG_STATE_HOME="$work/state"  # node keys of the stages, created on first use
common=(-t 1 -c 256 --ring-secret-file "$work/secret" --ca "$work/cert.pem" --log-level info)
ip netns exec "$pub" "$bin" stage -m "$model" --layers 0:2 --listen 10.77.0.1:7000 --next-via "$relay/nat-$tag-01" \
  --name head "${common[@]}" 2>"$work/stage0.log" &
pids+=($!)
ip netns exec "$phone" "$bin" stage -m "$model" --layers 2:4 --listen 10.77.0.2:7001 --pred-via "$relay/nat-$tag-01" \
  --next-via "$relay/nat-$tag-12" --name phone "${common[@]}" 2>"$work/stage1.log" &
pids+=($!)
ip netns exec "$pub" "$bin" stage -m "$model" --layers 4:5 --listen 10.77.0.1:7002 --pred-via "$relay/nat-$tag-12" \
  --next 10.77.0.1:7000 --name tail "${common[@]}" 2>"$work/stage2.log" &
pids+=($!)

# The phone's stage listens on 10.77.0.2:7001: from inside the phone that address answers...
up=0
for _ in $(seq 50); do
  if in_phone timeout 1 bash -c 'exec 3<>/dev/tcp/10.77.0.2/7001' 2>/dev/null; then up=1; break; fi
  sleep 0.1
done
[ $up -eq 1 ] || fail "the phone's stage is not listening on 10.77.0.2:7001"
# ...but a direct connection into the phone from outside fails.
if in_pub timeout 3 bash -c 'exec 3<>/dev/tcp/10.77.0.2/7001' 2>/dev/null; then
  fail "a direct TCP connection into the phone succeeded; the NAT rule is not in effect"
fi
echo "direct connection into the phone (10.77.0.2:7001): dropped by the NAT, as intended"
in_phone timeout 3 bash -c 'exec 3<>/dev/tcp/10.77.0.1/8443' || fail "the phone cannot reach the relay"

want=$("$bin" generate -m "$model" -p "Once upon a time" -n 24 --temp 0 -t 1 2>/dev/null) ||
  fail "single-process generate failed"
got=$(in_pub "$bin" generate --ring 10.77.0.1:7000 --ring-secret-file "$work/secret" -p "Once upon a time" -n 24 --temp 0 2>"$work/client.log")
status=$?
if [ $status -ne 0 ] || [ "$got" != "$want" ]; then
  echo "--- want: $want"
  echo "--- got:  $got (exit $status)"
  for f in client relay stage0 stage1 stage2; do echo "--- $f.log"; tail -n 20 "$work/$f.log"; done
  fail "the ring through the relay did not reproduce the single-process text"
fi
echo "ring with the phone behind NAT, both its links relayed over wss: $got"
grep -q "paired" "$work/relay.log" || fail "the relay paired no edge"
echo "PASS"
