#!/usr/bin/env python3
"""The per-tensor types of a quantized file, as llama.cpp's quantizer (llama-quantize) picks them.

The rules of llama.cpp's llama_tensor_get_type for dense llama-family models (llama, qwen2, qwen3;
no importance matrix, no per-tensor overrides), written out here in plain Python, so that the
types `kvasir synth --type MIX` writes are checked against a source the C++ code under test had
no part in:

  quant_mix.py --assets DIR [--kvasir BIN]
    the rules reproduce every tensor type of the files llama-quantize made (DIR/models: the
    synth-* and stories260K-q* files); with --kvasir, for several shapes and every file type,
    `kvasir synth --header-only` writes the types the rules give. Exit 77 (skip) when an asset is
    missing, unless KVASIR_REQUIRE_ASSETS=1.

Two places where Kvasir knowingly departs from llama-quantize, both for rows that are not a whole
number of blocks: llama.cpp falls back from q2_k/q3_k to iq4_nl, which Kvasir's kernels do not
have (Kvasir writes q4_0, the same block size); and where even the fallback's 32-value blocks do
not divide a row of a legacy type (q4_0 ... q8_0 and the output rule's q8_0), llama.cpp refuses
the file ("Unsupported tensor size") while Kvasir writes f16. Those two are the only differences
accepted; anything else fails.
"""
import argparse
import os
import re
import subprocess
import sys
import tempfile

from gguf_header import read_header

# llama_ftype: file type name -> (general.file_type, the type of every matrix no rule changes)
FTYPES = {
    "f32": (0, "f32"), "f16": (1, "f16"), "bf16": (32, "bf16"),
    "q4_0": (2, "q4_0"), "q4_1": (3, "q4_1"), "q8_0": (7, "q8_0"), "q5_0": (8, "q5_0"),
    "q5_1": (9, "q5_1"), "q2_k": (10, "q2_k"), "q3_k_s": (11, "q3_k"), "q3_k_m": (12, "q3_k"),
    "q3_k_l": (13, "q3_k"), "q4_k_s": (14, "q4_k"), "q4_k_m": (15, "q4_k"), "q5_k_s": (16, "q5_k"),
    "q5_k_m": (17, "q5_k"), "q6_k": (18, "q6_k"),
}
FTYPE_BY_ID = {v[0]: k for k, v in FTYPES.items()}
BLOCK = {"f32": 1, "f16": 1, "bf16": 1, "q4_0": 32, "q4_1": 32, "q5_0": 32, "q5_1": 32,
         "q8_0": 32, "iq4_nl": 32, "q2_k": 256, "q3_k": 256, "q4_k": 256, "q5_k": 256,
         "q6_k": 256}
REFUSED = "refused"  # llama-quantize stops with "Unsupported tensor size encountered"


def use_more_bits(i, n):
    # The first and last eighth of the layers, and every third layer in between.
    return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2


def layer_of(name):
    m = re.match(r"blk\.(\d+)\.", name)
    return int(m.group(1)) if m else -1


def quantized_at_all(name, ne):
    """llama-quantize leaves vectors, norms and a few small matrices in their source type."""
    return len(ne) >= 2 and "_norm.weight" not in name and "ffn_gate_inp.weight" not in name \
        and "ssm_conv1d.weight" not in name


def llama_cpp_type(ftype, name, ne, model):
    """The type llama-quantize gives tensor `name` (dims `ne`) of a dense model in file type
    `ftype`; `model` holds arch, n_layer, n_gqa (head_count / head_count_kv), has_output. Tensors
    it does not quantize are reported as "source" (their type in the source file)."""
    base = FTYPES[ftype][1]
    if not quantized_at_all(name, ne):
        return "source"
    if BLOCK[base] == 1:  # f32/f16/bf16 files: every quantizable matrix gets the base type
        return base
    t = base
    n = model["n_layer"]
    i = layer_of(name)  # the attn_v / ffn_down counters: the layer, in a dense model
    nx = ne[0]
    if name == "output.weight" or (not model["has_output"] and name == "token_embd.weight"):
        if nx % 256 != 0:
            t = "q8_0"
        elif t != "q8_0":
            t = "q6_k"
    elif name == "token_embd.weight":
        pass  # only the i-quant mixes change it
    elif "attn_v.weight" in name:
        if ftype == "q2_k":
            t = "q4_k" if model["n_gqa"] >= 4 else "q3_k"
        elif ftype == "q3_k_m":
            t = "q5_k" if i < 2 else "q4_k"
        elif ftype == "q3_k_l":
            t = "q5_k"
        elif ftype in ("q4_k_m", "q5_k_m") and use_more_bits(i, n):
            t = "q6_k"
        elif ftype == "q4_k_s" and i < 4:
            t = "q5_k"
        # 70B-class llama/qwen2 (80 layers, grouped KV heads): attn_v is 8x smaller than attn_q.
        if model["is_70b"] and t in ("q3_k", "q4_k"):
            t = "q5_k"
    elif "ffn_down" in name:
        if ftype == "q2_k":
            t = "q3_k"
        elif ftype == "q3_k_m":
            t = "q5_k" if i < n // 16 else "q4_k"
        elif ftype == "q3_k_l":
            t = "q5_k"
        elif ftype in ("q4_k_m", "q5_k_m"):
            if use_more_bits(i, n):
                t = "q6_k"
        elif ftype == "q4_k_s" and i < n // 8:
            t = "q5_k"
    elif "attn_output.weight" in name:
        t = {"q2_k": "q3_k", "q3_k_m": "q4_k", "q3_k_l": "q5_k"}.get(ftype, t)
    elif "attn_qkv.weight" in name:
        t = {"q3_k_m": "q4_k", "q3_k_l": "q4_k", "q4_k_m": "q5_k", "q5_k_m": "q6_k"}.get(ftype, t)
    if nx % BLOCK[t] == 0:
        return t
    # Rows that are not whole blocks of the chosen type.
    fallback = {"q2_k": "iq4_nl", "q3_k": "iq4_nl", "q4_k": "q5_0", "q5_k": "q5_1",
                "q6_k": "q8_0"}.get(t)
    if fallback is None:
        return REFUSED
    return fallback if nx % BLOCK[fallback] == 0 else "f16"


def kvasir_expects(llama):
    """What Kvasir writes where llama-quantize writes `llama` (see the module comment)."""
    return {"iq4_nl": "q4_0", REFUSED: "f16", "source": "f32"}.get(llama, llama)


def model_of(meta, tensors):
    arch = meta["general.architecture"]
    n_layer = int(meta[f"{arch}.block_count"])
    heads = int(meta[f"{arch}.attention.head_count"])
    kv = int(meta.get(f"{arch}.attention.head_count_kv", heads))
    names = {t[0] for t in tensors}
    return {"arch": arch, "n_layer": n_layer, "n_gqa": heads // kv,
            "has_output": "output.weight" in names,
            "is_70b": arch in ("llama", "qwen2") and n_layer == 80 and heads != kv}


def check_reference(paths):
    """llama-quantize's own files: every tensor's type is what the rules say."""
    bad = checked = 0
    for path in paths:
        meta, tensors = read_header(path)
        ftype = FTYPE_BY_ID.get(int(meta.get("general.file_type", -1)))
        if ftype is None or BLOCK[FTYPES[ftype][1]] == 1:
            print(f"{path}: general.file_type {meta.get('general.file_type')} is not a quantized "
                  "file type")
            bad += 1
            continue
        model = model_of(meta, tensors)
        for name, ne, have in tensors:
            want = llama_cpp_type(ftype, name, ne, model)
            if want == "source":
                want = "f32"  # vectors and norms: f32 in every source these were made from
            if want == REFUSED:
                # llama-quantize stops on such a tensor unless told its type (--tensor-type).
                print(f"{os.path.basename(path)}: {name}: {have} (set by hand: llama-quantize "
                      f"refuses a {ne[0]}-wide {FTYPES[ftype][1]} row)")
                continue
            checked += 1
            if have != want:
                print(f"{path}: {name} {ne}: {have}, the rules give {want}")
                bad += 1
    return bad, checked


# (arch, layers, embd, heads, kv-heads, ff, tied): each shape reaches other rules.
SHAPES = [
    ("llama", 2, 256, 8, 4, 512, False),   # the shape of the shared synth-llama-q4_k_m
    ("llama", 8, 256, 4, 4, 512, False),   # use_more_bits on 8 layers, q4_k_s's first four
    ("llama", 32, 256, 8, 2, 512, False),  # n_gqa 4 (q2_k attn_v), q3_k_m's first sixteenth
    ("llama", 80, 256, 8, 2, 256, False),  # 70B-class: attn_v gets q5_k over q3_k/q4_k
    ("qwen2", 4, 288, 4, 4, 512, True),    # 288-wide rows: every k-quant falls back; tied output
    ("qwen3", 3, 256, 4, 2, 96, True),     # a 96-wide ffn_down falls back
    ("llama", 2, 64, 4, 2, 72, False),     # a 72-wide ffn_down is not even 32-value blocks
]


def check_kvasir(kvasir, vocab):
    bad = checked = 0
    with tempfile.TemporaryDirectory() as tmp:
        for arch, layers, embd, heads, kv, ff, tied in SHAPES:
            for ftype in FTYPES:
                out = os.path.join(tmp, f"{arch}-{layers}-{embd}-{ftype}.gguf")
                cmd = [kvasir, "synth", "--arch", arch, "--layers", str(layers), "--embd", str(embd),
                       "--heads", str(heads), "--kv-heads", str(kv), "--ff", str(ff),
                       "--vocab-from", vocab, "--type", ftype, "--header-only", "-o", out]
                if tied:
                    cmd.append("--tied")
                run = subprocess.run(cmd, capture_output=True, text=True)
                shape = f"{arch} {layers}x{embd} ff {ff}{' tied' if tied else ''} --type {ftype}"
                if run.returncode != 0:
                    print(f"{shape}: kvasir synth failed (exit {run.returncode}): {run.stderr}")
                    bad += 1
                    continue
                meta, tensors = read_header(out)
                os.remove(out)
                if int(meta.get("general.file_type", -1)) != FTYPES[ftype][0]:
                    print(f"{shape}: general.file_type {meta.get('general.file_type')}, llama.cpp's "
                          f"is {FTYPES[ftype][0]}")
                    bad += 1
                model = model_of(meta, tensors)
                for name, ne, have in tensors:
                    want = kvasir_expects(llama_cpp_type(ftype, name, ne, model))
                    checked += 1
                    if have != want:
                        print(f"{shape}: {name} {ne}: kvasir wrote {have}, llama-quantize's rules "
                              f"give {want}")
                        bad += 1
    return bad, checked


# Files llama-quantize made (../shared/reference/README.md, "Derived files" and "Synthetic files").
REFERENCE_FILES = ["synth-llama-q4_k_m.gguf", "synth-qwen2-q8_0.gguf", "synth-qwen3-q4_0.gguf",
                   "stories260K-q4_0.gguf", "stories260K-q8_0.gguf"]


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--assets", metavar="DIR",
                    help="the shared assets (models/): llama-quantize's files, and the vocabulary "
                         "for synth ($KVASIR_ASSETS when set)")
    ap.add_argument("--reference", nargs="*", metavar="GGUF",
                    help="files made by llama-quantize (default: those in DIR/models)")
    ap.add_argument("--kvasir", metavar="BIN", help="the kvasir binary to check")
    ap.add_argument("--vocab-from", metavar="GGUF",
                    help="a GGUF with a vocabulary, for synth (default DIR/models/stories260K.gguf)")
    a = ap.parse_args()
    assets = os.environ.get("KVASIR_ASSETS") or a.assets  # as the other tests: the environment wins
    models = os.path.join(assets, "models") if assets else None
    reference = a.reference if a.reference is not None else \
        [os.path.join(models, f) for f in REFERENCE_FILES] if models else []
    vocab = a.vocab_from or (os.path.join(models, "stories260K.gguf") if models else None)
    if not reference and not a.kvasir:
        ap.error("give --assets DIR (or --reference GGUF...) and/or --kvasir BIN")
    missing = [p for p in reference + ([vocab] if a.kvasir else []) if not p or not os.path.exists(p)]
    if missing:
        why = f"missing asset: {', '.join(str(p) for p in missing)}"
        if os.environ.get("KVASIR_REQUIRE_ASSETS") == "1":
            print(f"FAIL: {why} (KVASIR_REQUIRE_ASSETS=1: required)")
            return 1
        print(f"SKIP: {why}")
        return 77
    bad = 0
    if reference:
        b, n = check_reference(reference)
        print(f"llama-quantize's files: {n} tensor types checked, {b} differ from the rules")
        bad += b
    if a.kvasir:
        b, n = check_kvasir(a.kvasir, vocab)
        print(f"kvasir synth: {len(SHAPES)} shapes x {len(FTYPES)} file types, {n} tensor types "
              f"checked, {b} differ from llama-quantize's rules")
        bad += b
    print("FAIL" if bad else "ok")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
