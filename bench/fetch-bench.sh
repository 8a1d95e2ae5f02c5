#!/usr/bin/env bash
# Benchmarks `kvasir fetch` against a local nginx serving MODEL over http and https: a one-layer
# window and the whole model, next to curl downloading the whole file. Prints median seconds of
# RUNS runs per row. Usage: bench/fetch-bench.sh MODEL [LAYER] [RUNS]
# Example: bench/fetch-bench.sh build/bench-models/tinyllama-8l-q4_0.gguf 3 5
set -euo pipefail
cd "$(dirname "$0")/.."
model=$(realpath "${1:?usage: $0 MODEL [LAYER] [RUNS]}")
layer=${2:-0}
runs=${3:-5}
bin=$(realpath ./build/bin/kvasir)
work=$(mktemp -d)
nginx_pid=
cleanup() { [ -n "$nginx_pid" ] && kill "$nginx_pid" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$work"; }
trap cleanup EXIT
mkdir -p "$work/www" "$work/tmp" "$work/out"
ln -s "$model" "$work/www/model.gguf"
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 1 \
  -subj /CN=127.0.0.1 -addext subjectAltName=IP:127.0.0.1 \
  -keyout "$work/key.pem" -out "$work/cert.pem" >/dev/null 2>&1
port=$((18000 + RANDOM % 2000))
user=""; [ "$(id -u)" -eq 0 ] && user="user root;"
cat >"$work/nginx.conf" <<CONF
$user
daemon off; master_process off; worker_processes 1;
error_log $work/error.log warn; pid $work/nginx.pid;
events { worker_connections 256; }
http {
  access_log off; client_body_temp_path $work/tmp; proxy_temp_path $work/tmp;
  fastcgi_temp_path $work/tmp; uwsgi_temp_path $work/tmp; scgi_temp_path $work/tmp;
  server { listen 127.0.0.1:$port; root $work/www; }
  server { listen 127.0.0.1:$((port + 1)) ssl; root $work/www;
           ssl_certificate $work/cert.pem; ssl_certificate_key $work/key.pem; }
}
CONF
nginx_bin=$(command -v nginx || echo /usr/sbin/nginx)
"$nginx_bin" -p "$work" -c "$work/nginx.conf" &
nginx_pid=$!
sleep 0.5
http="http://127.0.0.1:$port/model.gguf"
https="https://127.0.0.1:$((port + 1))/model.gguf"
n_layer=$($bin inspect "$model" | awk '/\.block_count/ {print $3; exit}')

# median of RUNS wall-clock seconds of a command
median() {
  local times=()
  for ((r = 0; r < runs; r++)); do
    rm -f "$work"/out/*
    local t0 t1
    t0=$(date +%s.%N)
    "$@" >/dev/null 2>&1
    t1=$(date +%s.%N)
    times+=("$(echo "$t1 - $t0" | bc)")
  done
  printf '%s\n' "${times[@]}" | sort -n | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'
}

size=$(stat -c %s "$model")
printf '%-34s %10s %10s %10s\n' "what" "bytes" "median s" "MiB/s"
row() {
  local name=$1 bytes=$2
  shift 2
  local s
  s=$(median "$@")
  printf '%-34s %10d %10.3f %10.1f\n' "$name" "$bytes" "$s" "$(echo "$bytes / 1048576 / $s" | bc -l)"
}
one=$($bin fetch --url "$http" --layers "$layer:$((layer + 1))" -o "$work/out/x.gguf" --json --log-level warn |
  awk -F': ' '/"downloaded_bytes"/ {gsub(",", "", $2); print $2}')
row "fetch layer $layer:$((layer + 1)) http" "$one" $bin fetch --url "$http" --layers "$layer:$((layer + 1))" -o "$work/out/x.gguf"
row "fetch layers 0:$n_layer http" "$size" $bin fetch --url "$http" --layers "0:$n_layer" -o "$work/out/x.gguf"
row "curl whole file http" "$size" curl -s -o "$work/out/c.gguf" "$http"
row "fetch layers 0:$n_layer https" "$size" $bin fetch --url "$https" --ca "$work/cert.pem" --layers "0:$n_layer" -o "$work/out/x.gguf"
row "curl whole file https" "$size" curl -s --cacert "$work/cert.pem" -o "$work/out/c.gguf" "$https"
