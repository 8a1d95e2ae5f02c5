#!/usr/bin/env bash
# Heartbeats a second and their latency on `kvasir market`, as in docs/PERFORMANCE.md ("Simulated
# nodes"): one process on SQLite, one or two on PostgreSQL (a server of its own, started here on a
# Unix socket, with its defaults: fsync on), with 1,000 or 10,000 simulated nodes of
# bench/market_load. Prints the load average before and after each run (a shared machine).
#   bench/market-load.sh STORE PROCESSES NODES [market_load options...]
#   bench/market-load.sh sqlite 1 10000 --threads 16 --seconds 10 --map false
# STORE: sqlite or postgresql. Environment: BIN (build/bin), WORK (a temporary directory), WIDE,
# PORT (the first market's port, 18951; the second gets the next), MARKET_ARGS (more `kvasir market` options, e.g. "--lease-flush 0" for the write-through store),
# PG_ARGS (more server options, e.g. "-c synchronous_commit=off"), PG_STATEMENTS=1 (PostgreSQL:
# load pg_stat_statements and print, after the run, the statements by calls with their mean time,
# and the transactions committed and rolled back).
set -euo pipefail
store=${1:?sqlite or postgresql}
procs=${2:?1 or 2}
nodes=${3:?nodes}
shift 3
BIN=${BIN:-build/bin}
WORK=${WORK:-$(mktemp -d /tmp/market-load.XXXXXX)}
MARKET_ARGS=${MARKET_ARGS:-}
VOCAB=${VOCAB:-../shared/models/stories260K.gguf}
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done
  if [[ -n ${pg_bin:-} ]]; then runas "$pg_bin/pg_ctl" -D "$WORK/pg/data" -m immediate -w stop \
    >/dev/null 2>&1 || true; fi
}
trap cleanup EXIT
runas() { if [[ $(id -u) == 0 ]]; then runuser -u postgres -- "$@"; else "$@"; fi; }

# 1,008 windows (a 32-layer model as 63 rings of 16 windows) for up to 1,008 nodes; 10,080 above:
# ten such models, or with WIDE=1 one 160-layer model as 63 rings of 160 windows (one layer a
# window: a heartbeat reads its whole ring, ten times as many windows and claims).
n_models=1
if (( nodes <= 1008 )); then layers=32; windows=16
elif [[ ${WIDE:-0} == 1 ]]; then layers=160; windows=160
else layers=32; windows=16; n_models=10; fi
gguf=$WORK/load$layers.gguf
[[ -f $gguf ]] || "$BIN/kvasir" synth --arch llama --layers $layers --embd 64 --heads 4 \
  --kv-heads 4 --ff 128 --vocab-from "$VOCAB" --type f32 --seed 1 -o "$gguf" >/dev/null

if [[ $store == postgresql ]]; then
  pg_bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -1)
  mkdir -p "$WORK/pg"
  if [[ $(id -u) == 0 ]]; then chmod a+x "$WORK"; chown postgres "$WORK/pg"; fi
  runas "$pg_bin/initdb" -D "$WORK/pg/data" -U kvasir -A trust >/dev/null
  runas "$pg_bin/pg_ctl" -D "$WORK/pg/data" -l "$WORK/pg/server.log" -w -o \
    "-c listen_addresses='' -c unix_socket_directories=$WORK/pg -p 5432 -c max_connections=200 \
     ${PG_STATEMENTS:+-c shared_preload_libraries=pg_stat_statements} ${PG_ARGS:-}" \
    start >/dev/null
  db="postgresql:///postgres?host=$WORK/pg&port=5432&user=kvasir"
else
  db=$WORK/market.sqlite
  rm -f "$db" "$db"-wal "$db"-shm
fi
model_args=()
for ((m = 0; m < n_models; ++m)); do
  name=load; if (( n_models > 1 )); then name=load$m; fi
  "$BIN/kvasir" market add-model --db "$db" -m "$gguf" --url http://127.0.0.1:1/load.gguf \
    --windows $windows --rings 63 --name $name >/dev/null
  model_args+=(--model $name)
done

urls=()
for ((i = 0; i < procs; ++i)); do
  port=$((${PORT:-18951} + i))
  # shellcheck disable=SC2086
  "$BIN/kvasir" market --db "$db" --listen 127.0.0.1:$port --lease 3600 --serve-deadline 86400 \
    --log-level warn $MARKET_ARGS &
  pids+=($!)
  urls+=(--market http://127.0.0.1:$port)
done
for ((i = 0; i < procs; ++i)); do
  until curl -sf http://127.0.0.1:$((${PORT:-18951} + i))/health >/dev/null; do sleep 0.2; done
done
if [[ $store == postgresql && -n ${PG_STATEMENTS:-} ]]; then
  runas "$pg_bin/psql" -X -q -h "$WORK/pg" -p 5432 -U kvasir -d postgres \
    -c "CREATE EXTENSION IF NOT EXISTS pg_stat_statements" -c "SELECT pg_stat_statements_reset()" \
    -c "SELECT pg_stat_reset()" >/dev/null
fi
echo "load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
status=0
"$BIN/market_load" "${urls[@]}" "${model_args[@]}" --gguf "$gguf" --nodes "$nodes" "$@" || status=$?
echo "load average after: $(cut -d' ' -f1-3 /proc/loadavg)"
if [[ $store == postgresql && -n ${PG_STATEMENTS:-} ]]; then
  psql="runas $pg_bin/psql -X -q -h $WORK/pg -p 5432 -U kvasir -d postgres"
  $psql -c "SELECT calls, round(mean_exec_time::numeric, 3) AS mean_ms, left(query, 90) AS query
            FROM pg_stat_statements ORDER BY calls DESC LIMIT 25"
  $psql -c "SELECT xact_commit, xact_rollback FROM pg_stat_database WHERE datname = 'postgres'"
fi
exit $status
