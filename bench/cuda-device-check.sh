#!/usr/bin/env bash
# The CUDA backend on a machine with an NVIDIA GPU, in one go (docs/BACKENDS.md, "The CUDA backend";
# the figures go to docs/PERFORMANCE.md). Run from anywhere in the repository; everything it writes
# goes under $OUT (default build-cuda-check/out): a log per step and summary.txt.
#
#   OUT=/tmp/out bench/cuda-device-check.sh
#
# Steps, each with its own time limit so the whole stays under 8 minutes on a 16-core machine:
#   1. the machine: nvidia-smi, nvcc, cmake, and the build's Debian packages that are missing;
#   2. a CUDA-only build (no OpenCL, no benchmarks) of kvasir and the backend tests for sm_90
#      alone, in build-cuda-check/ (or KVASIR_PREBUILT=DIR: a directory holding kvasir,
#      backend_test, cuda_device_test and cuda_blocks_test built elsewhere);
#   3. the op-by-op test of the CUDA backend against the CPU, the host block tests and the device
#      tests (batch-independent products, a full device, whole windows against the CPU);
#   4. generate on CUDA and a 3-stage ring whose middle stage runs on CUDA, against the all-CPU
#      greedy text, and eval logits against the CPU's, on stories260K (F32, Q8_0, Q4_0) and
#      models `kvasir synth` writes (llama Q4_K_M, qwen3 Q4_0, qwen35moe F32 and Q4_K_M);
#   5. kvasir bench --backend cuda on the Q4_0 and Q4_K_M bench models of docs/PERFORMANCE.md
#      (and llama.cpp's llama-bench on the same files when LLAMA_BENCH names one).
# Test data: stories260K and the llama vocabulary from KVASIR_ASSETS, ./shared or ../shared.
# Nothing is downloaded. A step that cannot run says why in summary.txt and the next one goes on.
#
# Where the GPU machine lacks the build's packages, pack the binaries on a machine that has them:
#   bench/cuda-device-check.sh --pack DIR [BUILD_DIR]
# builds kvasir and the tests for sm_90 (Release, in build-cuda-pack/, unless BUILD_DIR holds them
# already), and copies them stripped into DIR with the shared libraries they need but glibc's
# (DIR/lib); then KVASIR_PREBUILT=DIR on the GPU machine.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 1
root=$(pwd)
bins=(kvasir backend_test cuda_blocks_test cuda_device_test)
if [[ ${1:-} == --pack ]]; then
  dir=${2:?usage: $0 --pack DIR [BUILD_DIR]}
  build=${3:-}
  if [[ -z $build ]]; then
    build=$root/build-cuda-pack
    cmake -S "$root" -B "$build" -DCMAKE_BUILD_TYPE=Release -DKVASIR_CUDA=ON -DKVASIR_OPENCL=OFF \
      -DKVASIR_BUILD_BENCH=OFF -DKVASIR_BUILD_TESTS=ON -DCMAKE_CUDA_ARCHITECTURES=90 || exit 1
    cmake --build "$build" -j "$(nproc)" --target "${bins[@]}" || exit 1
  fi
  mkdir -p "$dir/lib"
  for b in "${bins[@]}"; do
    strip -o "$dir/$b" "$build/bin/$b" || exit 1
    ldd "$build/bin/$b" | awk '/=> \// {print $3}' |
      grep -vE '/(libc|libm|libdl|librt|libpthread|ld-linux[^/]*)\.so' |
      xargs -r cp -L -t "$dir/lib"
  done
  du -sh "$dir"
  exit 0
fi
OUT=${OUT:-$root/build-cuda-check/out}
mkdir -p "$OUT"
summary="$OUT/summary.txt"
: >"$summary"
start=$(date +%s)
jobs=$(nproc 2>/dev/null || echo 4)
note() { echo "$*" | tee -a "$summary"; }
elapsed() { echo $(($(date +%s) - start)); }
# step NAME SECONDS CMD...: runs CMD with a time limit, its output in $OUT/NAME.log.
step() {
  local name=$1 limit=$2 t0
  shift 2
  t0=$(date +%s)
  timeout --kill-after=10 "$limit" "$@" >"$OUT/$name.log" 2>&1
  local rc=$?
  note "$(printf '%-34s rc=%-3s %4ss' "$name" "$rc" "$(($(date +%s) - t0))")"
  return $rc
}

# ---- 1. The machine -------------------------------------------------------------------------
{
  date -u
  uname -a
  nvidia-smi 2>&1 || echo "nvidia-smi: not found"
  for nvcc in nvcc /usr/local/cuda/bin/nvcc; do command -v $nvcc >/dev/null && $nvcc --version && break; done
  cmake --version 2>&1 | head -1
  command -v ninja >/dev/null && echo "ninja $(ninja --version)" || echo "ninja: not found (make instead)"
  g++ --version 2>&1 | head -1
  echo "cores: $jobs"
  # The build's Debian packages (scripts/install-deps.sh); dpkg says which are missing.
  for p in libfmt-dev libhwy-dev nlohmann-json3-dev libssl-dev libboost-dev libcli11-dev \
    libsodium-dev libpcre2-dev libsqlite3-dev libgtest-dev libgmock-dev pkg-config; do
    dpkg -s "$p" >/dev/null 2>&1 || echo "missing package: $p"
  done
} >"$OUT/machine.log" 2>&1
note "machine: $(grep -m1 -o 'NVIDIA [A-Z0-9a-z -]*' "$OUT/machine.log" || echo 'no nvidia-smi output')"
grep '^missing package' "$OUT/machine.log" | tee -a "$summary"

assets=${KVASIR_ASSETS:-}
for a in "$assets" "$root/shared" "$root/../shared"; do
  if [[ -n $a && -f $a/models/stories260K.gguf ]]; then assets=$(cd "$a" && pwd); break; fi
done
note "assets: ${assets:-none (steps 4 and 5 need models/stories260K.gguf)}"

# ---- 2. The build ---------------------------------------------------------------------------
if [[ -n ${KVASIR_PREBUILT:-} ]]; then
  bin=$(cd "$KVASIR_PREBUILT" && pwd)
  [[ -d $bin/lib ]] && export LD_LIBRARY_PATH=$bin/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  note "binaries: prebuilt in $bin"
else
  bin=$root/build-cuda-check/bin
  gen=()
  command -v ninja >/dev/null && gen=(-G Ninja)
  step configure 120 cmake -S "$root" -B "$root/build-cuda-check" "${gen[@]}" \
    -DCMAKE_BUILD_TYPE=Release -DKVASIR_CUDA=ON -DKVASIR_OPENCL=OFF -DKVASIR_BUILD_BENCH=OFF \
    -DKVASIR_BUILD_TESTS=AUTO -DCMAKE_CUDA_ARCHITECTURES=90
  targets=(kvasir)
  grep -q "GoogleTest not found" "$OUT/configure.log" ||
    targets+=("${bins[@]:1}")
  step build 330 cmake --build "$root/build-cuda-check" -j "$jobs" --target "${targets[@]}"
  tail -30 "$OUT/build.log" >"$OUT/build-tail.log"
fi
kvasir=$bin/kvasir
if [[ ! -x $kvasir ]]; then
  note "no kvasir binary at $kvasir: see configure.log / build.log; stopping"
  exit 1
fi
step devices 60 "$kvasir" devices

# ---- 3. The tests ---------------------------------------------------------------------------
export KVASIR_ASSETS=${assets:-/nonexistent}
if [[ -x $bin/backend_test ]]; then
  step op-test 150 "$bin/backend_test" --gtest_filter='Backends/OpTest.*cuda*:BackendRegistry*'
  grep -E '^\[  (FAILED|SKIPPED|PASSED) ' "$OUT/op-test.log" | sort | uniq -c | head -40 >>"$summary"
  step blocks-test 60 "$bin/cuda_blocks_test"
  step device-test 180 "$bin/cuda_device_test"
  grep -E 'normalised squared error|FAILED|Skipped' "$OUT/device-test.log" >>"$summary"
else
  note "no backend_test (GoogleTest missing?): the op test did not run"
fi

# ---- 4. Rings and logits against the CPU ----------------------------------------------------
models=$root/build-cuda-check/models
mkdir -p "$models"
prompt="Once upon a time"
if [[ -n $assets ]]; then
  for m in stories260K stories260K-q8_0 stories260K-q4_0; do
    [[ -f $assets/models/$m.gguf ]] && cp "$assets/models/$m.gguf" "$models/"
  done
  vocab=$assets/models/stories260K.gguf
  synth() {  # synth NAME ARGS...: a small model of the stories260K vocabulary
    local name=$1
    shift
    [[ -f $models/$name.gguf ]] || "$kvasir" synth "$@" --vocab-from "$vocab" --seed 1 \
      -o "$models/$name.gguf" >>"$OUT/synth.log" 2>&1
  }
  synth synth-llama-q4_k_m --arch llama --layers 4 --embd 256 --heads 8 --kv-heads 2 --ff 768 \
    --type q4_k_m
  synth synth-qwen3-q4_0 --arch qwen3 --layers 4 --embd 256 --heads 8 --kv-heads 2 --ff 768 \
    --head-dim 64 --type q4_0
  for t in f32 q4_k_m; do
    synth synth-qwen35moe-$t --arch qwen35moe --layers 4 --embd 256 --heads 4 --kv-heads 2 \
      --head-dim 64 --ssm-state 32 --ssm-groups 2 --ssm-v-heads 4 --experts 8 --experts-used 2 \
      --expert-ff 256 --shared-ff 256 --attn-interval 2 --type $t
  done
  for f in "$models"/*.gguf; do
    m=$(basename "$f" .gguf)
    [[ $m == tinyllama-* ]] && continue  # the bench models of step 5
    "$kvasir" generate -m "$f" -p "$prompt" -n 32 --temp 0 -t 4 >"$OUT/gen-cpu-$m.out" \
      2>"$OUT/gen-cpu-$m.log"
    cpu=$(cat "$OUT/gen-cpu-$m.out")
    timeout 60 "$kvasir" generate -m "$f" -p "$prompt" -n 32 --temp 0 --backend cuda \
      >"$OUT/gen-cuda-$m.out" 2>"$OUT/gen-cuda-$m.log"
    rc=$?
    if [[ $rc == 0 ]] && cmp -s "$OUT/gen-cpu-$m.out" "$OUT/gen-cuda-$m.out"; then
      note "  $m: generate on cuda = the CPU's greedy text"
    else
      note "  $m: generate on cuda DIFFERS from the CPU's greedy text or failed (rc $rc)"
    fi
    ring=$(timeout 90 "$kvasir" run -m "$f" --stages 3 --backends cpu,cuda,cpu -p "$prompt" -n 32 \
      --temp 0 -t 2 2>"$OUT/ring-$m.log")
    echo "$ring" >"$OUT/ring-$m.out"
    if [[ -n $ring && $ring == "$cpu" ]]; then
      note "  $m: 3-stage ring cpu,cuda,cpu = the all-CPU greedy text"
    else
      note "  $m: 3-stage ring cpu,cuda,cpu DIFFERS or failed (ring-$m.log, ring-$m.out)"
    fi
    "$kvasir" eval -m "$f" --prompt "$prompt, there was a little girl named" \
      --logits "$OUT/logits-cpu-$m.f32" >/dev/null 2>&1
    "$kvasir" eval -m "$f" --prompt "$prompt, there was a little girl named" --backend cuda \
      --logits "$OUT/logits-cuda-$m.f32" >"$OUT/eval-cuda-$m.log" 2>&1
    if command -v python3 >/dev/null; then
      python3 - "$OUT/logits-cpu-$m.f32" "$OUT/logits-cuda-$m.f32" <<'EOF' | tee -a "$summary"
import array, sys
a, b = array.array('f'), array.array('f')
try:
    a.frombytes(open(sys.argv[1], 'rb').read()); b.frombytes(open(sys.argv[2], 'rb').read())
except OSError as e:
    print(f"    eval: {e}"); sys.exit()
if len(a) != len(b) or not a:
    print(f"    eval: {len(b)} logits on cuda, {len(a)} on the cpu"); sys.exit()
err = sum((x - y) ** 2 for x, y in zip(a, b)); norm = sum(y * y for y in a)
print(f"    eval logits: normalised squared error {err / norm:.3g}, max |diff| "
      f"{max(abs(x - y) for x, y in zip(a, b)):.3g} over {len(a)} values")
EOF
    fi
  done
else
  note "rings, generate and eval: skipped (no assets)"
fi

# ---- 5. Speed -------------------------------------------------------------------------------
spm=${assets:+$assets/vocab/ggml-vocab-llama-spm.gguf}
[[ -n $spm && -f $spm ]] || spm=${assets:+$assets/models/stories260K.gguf}
if [[ -n $spm && $(elapsed) -lt 400 ]]; then
  for t in q4_0 q4_k_m; do
    f=$models/tinyllama-8l-$t.gguf
    [[ -f $f ]] || "$kvasir" synth --arch llama --layers 8 --embd 2048 --heads 32 --kv-heads 4 \
      --ff 5632 --vocab-from "$spm" --type $t --seed 1 -t "$jobs" -o "$f" >>"$OUT/synth.log" 2>&1
    step "bench-cuda-$t" 90 "$kvasir" bench -m "$f" --backend cuda -p 128 -n 64 -r 3
    cat "$OUT/bench-cuda-$t.log" >>"$summary"
    if [[ $(elapsed) -lt 420 ]]; then
      step "bench-cuda-$t-p512" 60 "$kvasir" bench -m "$f" --backend cuda -p 512 -n 128 -r 3
      cat "$OUT/bench-cuda-$t-p512.log" >>"$summary"
    fi
    if [[ -n ${LLAMA_BENCH:-} ]]; then
      step "llama-bench-$t" 90 "$LLAMA_BENCH" -m "$f" -p 128,512 -n 64,128 -r 3 -ngl 99
      cat "$OUT/llama-bench-$t.log" >>"$summary"
    fi
  done
else
  note "bench: skipped (no vocabulary, or past 400 s)"
fi
note "done in $(elapsed) s"
