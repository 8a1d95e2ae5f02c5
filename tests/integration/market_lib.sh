# Shared by the market's network-namespace tests (market_test.sh, market_standby_nat_test.sh):
# source it after netns_lib.sh, with `bin`, `model` and `pids` set. market_hosts builds the scene
# both start from: a public host and a phone behind a carrier NAT, nginx serving the model file,
# the relay over TLS, and a market database holding the model in three windows.
# shellcheck disable=SC2154  # bin, model, work, pub and phone are the sourcing test's or set here

in_pub() { ip netns exec "$pub" "$@"; }
in_phone() { ip netns exec "$phone" "$@"; }
dump_logs() {
  for f in "$work"/*.log; do echo "--- $(basename "$f")"; tail -n 30 "$f"; done
}
die() { dump_logs; fail "$*"; }

# Namespaces "pub" ($pub, at $pub_ip = 10.SUBNET.0.1) and "phone" ($phone, behind carrier_nat),
# named after PREFIX and this process. On pub: nginx serving `model` with Range support at
# http://$pub_ip:8081/stories260K.gguf, and the relay at wss://$pub_ip:8443 ($work/relay.secret,
# a certificate for $pub_ip in $work/cert.pem). $db holds the model in 3 windows of context 256
# (add-model's output in $work/add-model.out). Sets market_url; the market is not started.
market_hosts() {  # market_hosts PREFIX SUBNET
  local tag=$$
  pub=kv-${1}pub-$tag
  phone=kv-${1}phone-$tag
  pub_ip=10.$2.0.1
  two_hosts "$pub" "$phone" "$2" "${1}p$tag" "${1}f$tag"
  carrier_nat "$phone"

  mkdir -p "$work/files" "$work/nginx"
  cp "$model" "$work/files/stories260K.gguf"
  cat >"$work/nginx/nginx.conf" <<NGINX
user root;
daemon off;
pid $work/nginx/nginx.pid;
error_log $work/nginx.log;
events { worker_connections 64; }
http {
  access_log off;
  client_body_temp_path $work/nginx/body;
  proxy_temp_path $work/nginx/proxy;
  fastcgi_temp_path $work/nginx/fastcgi;
  uwsgi_temp_path $work/nginx/uwsgi;
  scgi_temp_path $work/nginx/scgi;
  server { listen $pub_ip:8081; root $work/files; }
}
NGINX
  # Background processes are started with `ip netns exec` directly (not through a function), so
  # `pids` holds the processes themselves and the cleanup stops them.
  ip netns exec "$pub" nginx -c "$work/nginx/nginx.conf" &
  pids+=($!)

  make_cert "$pub_ip"
  (umask 077 && head -c 32 /dev/urandom >"$work/relay.secret")
  ip netns exec "$pub" "$bin" relay --listen "$pub_ip:8443" --tls-cert "$work/cert.pem" \
    --tls-key "$work/key.pem" --secret-file "$work/relay.secret" 2>"$work/relay.log" &
  pids+=($!)

  db="$work/market.sqlite"
  "$bin" market add-model --db "$db" --model "$model" --url "http://$pub_ip:8081/stories260K.gguf" \
    --windows 3 --ctx 256 >"$work/add-model.out" 2>"$work/add-model.log" || die "add-model failed"
  market_url=https://$pub_ip:8080
}

# Starts the market on $db with leases of `lease` seconds (market_pid, added to `pids`) and waits
# until it answers.
start_market() {
  ip netns exec "$pub" "$bin" market --db "$db" --listen "$pub_ip:8080" --relay "wss://$pub_ip:8443" \
    --relay-secret-file "$work/relay.secret" --relay-ca "$work/cert.pem" --lease "$lease" \
    --tls-cert "$work/cert.pem" --tls-key "$work/key.pem" 2>>"$work/market.log" &
  market_pid=$!
  pids+=($market_pid)
  for _ in $(seq 100); do
    get /health >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  die "the market does not answer on $market_url"
}
# GET PATH from the market, trusting only its own certificate.
get() { in_pub curl -fsS --max-time 10 --cacert "$work/cert.pem" "$market_url$1"; }
map() { get /v1/map; }
wait_for() {  # wait_for SECONDS WHAT COMMAND...: until COMMAND succeeds
  local limit=$1 what=$2
  shift 2
  for _ in $(seq $((limit * 5))); do
    "$@" && return 0
    sleep 0.2
  done
  map
  die "$what: not within $limit s"
}

node_key() { "$bin" id --key "$work/$1.key" 2>/dev/null; }
# Flags every `join` of the test adds (set by the test after sourcing this file).
join_flags=()
join() {  # join NAME NAMESPACE [FLAGS...]: pid in pid_NAME
  local name=$1 ns=$2
  shift 2
  ip netns exec "$ns" "$bin" join --market "$market_url" --key "$work/$name.key" --memory 1GiB \
    --cache "$work/cache-$name" --ca "$work/cert.pem" --poll 0.5 -t 1 "${join_flags[@]}" "$@" \
    2>"$work/join-$name.log" &
  pids+=($!)
  eval "pid_$name=$!"
}
