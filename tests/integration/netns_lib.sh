# Shared by the network-namespace tests (nat_test.sh, capture_test.sh): source it after setting
# `pids` (an array of background processes to stop on exit).
skip() { echo "SKIP: $*"; exit 77; }
fail() { echo "FAIL: $*"; exit 1; }
# Something the test needs is missing: a skip, or a failure where everything is required.
missing() {
  if [ "${KVASIR_REQUIRE_ASSETS:-0}" = 1 ]; then fail "$* (KVASIR_REQUIRE_ASSETS=1: required)"; fi
  skip "$*"
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
