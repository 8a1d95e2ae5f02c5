#!/usr/bin/env bash
# Writes a seed corpus for one libFuzzer target into DIR: inputs from the shared assets
# (${KVASIR_ASSETS:-../shared}) plus, for the GGUF fuzzers, small valid files made here so that the
# fuzzer starts from inputs that parse completely.
# Usage: scripts/fuzz-seeds.sh FUZZER DIR
set -euo pipefail
cd "$(dirname "$0")/.."
fuzzer=${1:?usage: $0 FUZZER DIR}
dir=${2:?usage: $0 FUZZER DIR}
assets=${KVASIR_ASSETS:-$(cd .. && pwd)/shared}
mkdir -p "$dir"

# Little-endian fields, written to stdout as raw bytes.
le() {  # le BYTES VALUE
  local n=$1 v=$2 i out=""
  for ((i = 0; i < n; i++)); do
    out+=$(printf '\\x%02x' $(((v >> (8 * i)) & 255)))
  done
  printf "$out"
}
u32() { le 4 "$1"; }
u64() { le 8 "$1"; }
str() { u64 "${#1}"; printf '%s' "$1"; }
zeros() { head -c "$1" /dev/zero; }
kv_u32() { str "$1"; u32 4; u32 "$2"; }
kv_str() { str "$1"; u32 8; str "$2"; }
# Name, n_dims, ne..., type id, offset.
tensor() {
  local name=$1 type=$2 offset=$3 d
  shift 3
  str "$name"
  u32 $#
  for d in "$@"; do u64 "$d"; done
  u32 "$type"
  u64 "$offset"
}

# One kv of every value type, nested arrays, and tensors of a few types (f32, q8_0, q4_0).
gguf_all_types() {
  u32 0x46554747; u32 3; u64 3; u64 17
  kv_str general.architecture llama
  str t.u8; u32 0; printf '\xc8'
  str t.i8; u32 1; printf '\x9c'
  str t.u16; u32 2; le 2 60000
  str t.i16; u32 3; le 2 1234
  kv_u32 t.u32 4000000000
  str t.i32; u32 5; u32 0xfffffffe
  str t.f32; u32 6; u32 0x3fc00000
  str t.bool; u32 7; printf '\x01'
  str t.u64; u32 10; u64 123456789012
  str t.i64; u32 11; u64 -5
  str t.f64; u32 12; u64 0x3ff8000000000000
  str tokenizer.ggml.tokens; u32 9; u32 8; u64 3; str "<unk>"; str "<s>"; str "x"
  str tokenizer.ggml.scores; u32 9; u32 6; u64 3; u32 0; u32 0xbf800000; u32 0x40000000
  str a.bool; u32 9; u32 7; u64 2; printf '\x01\x00'
  str a.nested; u32 9; u32 9; u64 2; u32 4; u64 2; u32 1; u32 2; u32 8; u64 1; str deep
  kv_u32 llama.block_count 1
  tensor token_embd.weight 0 0 4 3
  tensor blk.0.attn_q.weight 8 64 32 2
  tensor blk.0.ffn_down.weight 2 160 64 1
}

gguf_alignment_64() {
  u32 0x46554747; u32 2; u64 1; u64 2
  kv_str general.architecture qwen2
  kv_u32 general.alignment 64
  tensor output_norm.weight 0 0 16
}

write_gguf() {  # write_gguf NAME GENERATOR ALIGNMENT DATA_BYTES
  local f=$dir/$1 size
  "$2" >"$f"
  size=$(stat -c %s "$f")
  zeros $(((($size + $3 - 1) / $3) * $3 - size)) >>"$f"
  zeros "$4" >>"$f"
}

case "$fuzzer" in
  gguf_*)
    write_gguf seed-all-types.gguf gguf_all_types 32 288
    write_gguf seed-alignment-64.gguf gguf_alignment_64 64 64
    for f in "$assets"/vocab/*.gguf "$assets"/models/stories260K*.gguf; do
      [ -e "$f" ] && cp "$f" "$dir/"
    done
    ;;
  tokenizer_*)
    for f in "$assets"/vocab/*.inp; do
      [ -e "$f" ] && cp "$f" "$dir/"
    done
    ;;
  grammar_fuzz) printf '\000root ::= "a" [b-d\\u00e9]* | x{1,3}\nx ::= ( "y" | . )+ # c\n\377abd\303\251' >"$dir/seed-grammar" && printf '\001{"type":"object","properties":{"a":{"type":"integer","minimum":-5},"b":{"enum":["x",1]}},"required":["a"]}\377{"a": -3}' >"$dir/seed-schema" ;;
  serve_request_fuzz)
    # The first byte picks the endpoint: 0 completions, 1 chat, 2 tokenize, 3 detokenize.
    seed() { printf "$1" >"$dir/$2"; printf '%s' "$3" >>"$dir/$2"; }
    seed '\x00' completion.json '{"model": "m", "prompt": "Once upon", "max_tokens": 8,
      "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05, "seed": 3, "stop": ["\n", "The"],
      "presence_penalty": 0.5, "frequency_penalty": 0.1, "logit_bias": {"13": -100},
      "stream": true, "stream_options": {"include_usage": true}, "n": 1, "user": "u"}'
    seed '\x00' prompt-list.json '{"prompt": ["x"], "echo": false, "logprobs": null}'
    seed '\x01' chat.json '{"messages": [{"role": "system", "content": "Be brief."},
      {"role": "user", "content": [{"type": "text", "text": "Hi"}]},
      {"role": "assistant", "content": null}], "max_completion_tokens": 4, "tools": [],
      "tool_choice": "none", "response_format": {"type": "text"}}'
    seed '\x01' chat-refused.json '{"messages": [{"role": "tool", "content": "x"}], "n": 2}'
    seed '\x02' tokenize.json '{"content": "Hello <s> world", "add_special": true, "with_pieces": true}'
    seed '\x03' detokenize.json '{"tokens": [1, 403, 407, 2]}'
    ;;
esac
# Checked-in seeds, if a target has any.
if [ -d "tests/fuzz/corpus/$fuzzer" ]; then cp -r "tests/fuzz/corpus/$fuzzer/." "$dir/"; fi
echo "fuzz-seeds: $(find "$dir" -type f | wc -l) seeds for $fuzzer in $dir"
