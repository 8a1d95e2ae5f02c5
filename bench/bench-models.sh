# Sourced by the bench scripts: the bench model of docs/PERFORMANCE.md ("The bench model"), an
# 8-layer TinyLlama-shaped llama synthesised once per weight type into
# ${KVASIR_BENCH_MODELS:-build/bench-models}.
#   bench_model KVASIR TYPE   writes the file with KVASIR's synth if it is missing; prints its path
bench_model() {
  local kvasir=$1 type=$2
  local dir=${KVASIR_BENCH_MODELS:-build/bench-models}
  local vocab=${KVASIR_ASSETS:-../shared}/vocab/ggml-vocab-llama-spm.gguf
  local m="$dir/tinyllama-8l-$type.gguf"
  mkdir -p "$dir"
  if [ ! -f "$m" ]; then
    "$kvasir" synth --arch llama --layers 8 --embd 2048 --heads 32 --kv-heads 4 --ff 5632 \
      --vocab-from "$vocab" --type "$type" --seed 1 -o "$m" 2>/dev/null || {
      echo "bench_model: $kvasir synth could not write $m" >&2
      return 1
    }
  fi
  printf '%s\n' "$m"
}
