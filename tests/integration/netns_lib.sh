# Shared by the network-namespace tests (nat_test.sh, capture_test.sh, market_test.sh,
# market_standby_nat_test.sh; the last two through market_lib.sh): source it
# after setting `pids` (an array of background processes to stop on exit). A test skips (exit 77)
# only where something it needs is missing and KVASIR_REQUIRE_ASSETS is not 1; under
# KVASIR_REQUIRE_ASSETS=1 (CI) every missing prerequisite, root and namespaces included, fails it.
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
# Something the test needs is missing: a skip, or a failure where everything is required.
missing() {
  if [ "${KVASIR_REQUIRE_ASSETS:-0}" = 1 ]; then fail "$* (KVASIR_REQUIRE_ASSETS=1: required)"; fi
  skip "$*"
}
# What every namespace test needs: `model`, iproute2, the test's own TOOL, and root.
require_netns() {  # require_netns TOOL "WHAT TOOL IS"
  [ -f "$model" ] || missing "missing asset $model"
  command -v ip >/dev/null || missing "iproute2 (ip) is not installed"
  command -v "$1" >/dev/null || missing "$2 is not installed"
  [ "$(id -u)" -eq 0 ] || missing "network namespaces need root (run as root, as CI does)"
}
# Stops every process in `pids` with SIGTERM, then kills what is still there after 5 s.
stop_pids() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; done
  for _ in $(seq 50); do
    alive=0
    for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && alive=1; done
    [ $alive -eq 0 ] && break
    sleep 0.1
  done
  for p in "${pids[@]}"; do
    if kill -0 "$p" 2>/dev/null; then
      echo "cleanup: process $p ($(tr '\0' ' ' </proc/$p/cmdline | cut -c1-80)) ignored SIGTERM for 5 s; killed"
      kill -9 "$p" 2>/dev/null
    fi
  done
  wait 2>/dev/null
}

# Two network namespaces NS_A and NS_B joined by a veth pair, at 10.SUBNET.0.1 and 10.SUBNET.0.2
# (/24), loopback up. Sets `work` (a temporary directory) and an exit trap that stops `pids`,
# removes both namespaces and the directory. Where the kernel refuses a namespace: a skip, or a
# failure under KVASIR_REQUIRE_ASSETS=1.
two_hosts() {  # two_hosts NS_A NS_B SUBNET VETH_A VETH_B
  ns_a=$1 ns_b=$2
  work=$(mktemp -d)
  trap netns_cleanup EXIT
  trap 'exit 1' INT TERM
  ip netns add "$ns_a" 2>"$work/err" || missing "cannot create a network namespace: $(cat "$work/err")"
  ip netns add "$ns_b" || fail "cannot create the second namespace"
  ip link add "$4" type veth peer name "$5" || fail "cannot create a veth pair"
  ip link set "$4" netns "$ns_a"
  ip link set "$5" netns "$ns_b"
  ip -n "$ns_a" addr add "10.$3.0.1/24" dev "$4"
  ip -n "$ns_b" addr add "10.$3.0.2/24" dev "$5"
  for ns in "$ns_a" "$ns_b"; do ip -n "$ns" link set lo up; done
  ip -n "$ns_a" link set "$4" up
  ip -n "$ns_b" link set "$5" up
}
netns_cleanup() {
  trap - EXIT INT TERM
  stop_pids
  ip netns del "$ns_a" 2>/dev/null
  ip netns del "$ns_b" 2>/dev/null
  rm -rf "$work"
}

# A simulated carrier NAT in namespace NS: an nftables input chain lets in answers to NS's own
# connections and drops every new inbound TCP connection.
carrier_nat() {  # carrier_nat NS
  ip netns exec "$1" nft -f - <<'NFT' || fail "cannot load the nftables rules"
table inet carrier_nat {
  chain input {
    type filter hook input priority 0; policy accept;
    iif lo accept
    ct state established,related accept
    tcp flags syn ct state new drop
  }
}
NFT
}

# A self-signed certificate for IP, valid for a day: $work/cert.pem and its key $work/key.pem.
make_cert() {  # make_cert IP
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
    -subj "/CN=$1" -addext "subjectAltName=IP:$1" \
    -keyout "$work/key.pem" -out "$work/cert.pem" >/dev/null 2>&1 || fail "openssl cannot make a certificate"
}
