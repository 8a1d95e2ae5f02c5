#!/usr/bin/env python3
"""Dequantized values of quantized blocks, computed from the block formats' definitions.

The blocks are ggml's (ggml-common.h): Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (32 values) and the K-quants
Q2_K..Q6_K (256 values). Each value is spelled out here from the layout of its block, in plain
Python with nothing shared with the C++ kernels, so the table in tests/kernels/kquant_values.json
is an independent source for tests/kernels/quantize_kquant_test.cpp.

Every block's scales are dyadic (0.5, -1.25, ...) and its quants small integers, so every value is
an exact float32 whatever the order of the C++ operations: the C++ test compares bit for bit.

  kquant_values.py --write FILE   writes the table
  kquant_values.py --check FILE   recomputes it and compares (exit 1 on any difference)
"""
import argparse
import json
import random
import struct
import sys

QK_K = 256


def f16(raw, off):
    return struct.unpack_from("<e", raw, off)[0]


def u8(raw, off):
    return raw[off]


def i8(raw, off):
    return struct.unpack_from("<b", raw, off)[0]


def q4_0(b):  # d (f16), qs[16]: low nibbles are values 0..15, high nibbles 16..31
    d = f16(b, 0)
    lo = [d * ((b[2 + j] & 15) - 8) for j in range(16)]
    hi = [d * ((b[2 + j] >> 4) - 8) for j in range(16)]
    return lo + hi


def q4_1(b):  # d, m (f16), qs[16]
    d, m = f16(b, 0), f16(b, 2)
    return [d * (b[4 + j] & 15) + m for j in range(16)] + [d * (b[4 + j] >> 4) + m for j in range(16)]


def q5_common(b, qh_off):
    qh = struct.unpack_from("<I", b, qh_off)[0]  # bit i is the fifth bit of value i
    qs = b[qh_off + 4:qh_off + 20]
    vals = []
    for i in range(32):
        nib = qs[i] & 15 if i < 16 else qs[i - 16] >> 4
        vals.append(nib | ((qh >> i) & 1) << 4)
    return vals


def q5_0(b):  # d, qh[4], qs[16]; values are q - 16
    d = f16(b, 0)
    return [d * (q - 16) for q in q5_common(b, 2)]


def q5_1(b):  # d, m, qh[4], qs[16]
    d, m = f16(b, 0), f16(b, 2)
    return [d * q + m for q in q5_common(b, 4)]


def q8_0(b):  # d, qs[32] int8
    d = f16(b, 0)
    return [d * i8(b, 2 + j) for j in range(32)]


def q2_k(b):  # scales[16] (low nibble scale, high nibble min), qs[64], d, dmin
    scales, qs, d, dmin = b[0:16], b[16:80], f16(b, 80), f16(b, 82)
    out = []
    for half in range(2):  # 128 values from 32 bytes of qs, 2 bits at a time
        for shift in range(4):
            for l in range(32):
                sc = scales[half * 8 + shift * 2 + l // 16]
                q = (qs[half * 32 + l] >> (2 * shift)) & 3
                out.append(d * (sc & 15) * q - dmin * (sc >> 4))
    return out


def k_scales_3(raw12):
    """Q3_K's sixteen 6-bit scales: low 4 bits in bytes 0..7 (two per byte), high 2 bits in 8..11."""
    out = []
    for i in range(16):
        low = raw12[i] & 15 if i < 8 else raw12[i - 8] >> 4
        high = (raw12[8 + i % 4] >> (2 * (i // 4))) & 3
        out.append((low | high << 4) - 32)
    return out


def q3_k(b):  # hmask[32], qs[64], scales[12], d
    hmask, qs, scales, d = b[0:32], b[32:96], k_scales_3(b[96:108]), f16(b, 108)
    out = []
    for half in range(2):
        for shift in range(4):
            bit = half * 4 + shift  # hmask bit of this group of 32
            for l in range(32):
                q = (qs[half * 32 + l] >> (2 * shift)) & 3
                q -= 0 if (hmask[l] >> bit) & 1 else 4
                out.append(d * scales[half * 8 + shift * 2 + l // 16] * q)
    return out


def k_scale_min_4(raw12, j):
    """Q4_K/Q5_K: scale and min of sub-block j (of 8), 6 bits each, packed in 12 bytes."""
    if j < 4:
        return raw12[j] & 63, raw12[j + 4] & 63
    sc = (raw12[j + 4] & 15) | (raw12[j - 4] >> 6) << 4
    mn = (raw12[j + 4] >> 4) | (raw12[j] >> 6) << 4
    return sc, mn


def q4_k(b):  # d, dmin, scales[12], qs[128]
    d, dmin, scales, qs = f16(b, 0), f16(b, 2), b[4:16], b[16:144]
    out = []
    for chunk in range(4):  # 64 values: low nibbles of 32 bytes, then their high nibbles
        for sub in range(2):
            sc, mn = k_scale_min_4(scales, 2 * chunk + sub)
            for l in range(32):
                q = (qs[32 * chunk + l] >> (4 * sub)) & 15
                out.append(d * sc * q - dmin * mn)
    return out


def q5_k(b):  # d, dmin, scales[12], qh[32], qs[128]
    d, dmin, scales, qh, qs = f16(b, 0), f16(b, 2), b[4:16], b[16:48], b[48:176]
    out = []
    for chunk in range(4):
        for sub in range(2):
            j = 2 * chunk + sub
            sc, mn = k_scale_min_4(scales, j)
            for l in range(32):
                q = (qs[32 * chunk + l] >> (4 * sub)) & 15 | ((qh[l] >> j) & 1) << 4
                out.append(d * sc * q - dmin * mn)
    return out


def q6_k(b):  # ql[128], qh[64], scales[16] int8, d
    ql, qh, d = b[0:128], b[128:192], f16(b, 208)
    out = [0.0] * QK_K
    for half in range(2):
        for l in range(32):
            for c in range(4):  # four groups of 32 per half
                low = (ql[64 * half + 32 * (c % 2) + l] >> (4 * (c // 2))) & 15
                high = (qh[32 * half + l] >> (2 * c)) & 3
                v = 128 * half + 32 * c + l
                out[v] = d * i8(b, 192 + v // 16) * ((low | high << 4) - 32)
    return out


# name: (bytes per block, values per block, dequantizer, [(offset, role)] of the f16 fields)
FORMATS = {
    "q4_0": (18, 32, q4_0, [0]),
    "q4_1": (20, 32, q4_1, [0, 2]),
    "q5_0": (22, 32, q5_0, [0]),
    "q5_1": (24, 32, q5_1, [0, 2]),
    "q8_0": (34, 32, q8_0, [0]),
    "q2_k": (84, QK_K, q2_k, [80, 82]),
    "q3_k": (110, QK_K, q3_k, [108]),
    "q4_k": (144, QK_K, q4_k, [0, 2]),
    "q5_k": (176, QK_K, q5_k, [0, 2]),
    "q6_k": (210, QK_K, q6_k, [208]),
}

# Dyadic f16 scales: every product with a small integer is exact in float32.
SCALES = [0.5, -1.25, 0.25, 0.125, 2.0, -0.375, 0.0625, 1.5]


def blocks(name):
    """The blocks of one format: the pattern block of quantize_kquant_test.cpp and two seeded ones."""
    size, _, _, f16_offsets = FORMATS[name]
    # The C++ test's pattern: byte i = (37 i + 11) mod 256, then its f16 fields.
    pattern = bytearray((i * 37 + 11) & 0xFF for i in range(size))
    pattern_scales = {
        "q4_0": [0.5], "q8_0": [0.5], "q4_1": [0.5, -1.25], "q5_1": [0.5, -1.25], "q5_0": [0.25],
        "q2_k": [0.5, 0.125], "q3_k": [0.25], "q4_k": [0.5, 0.25], "q5_k": [0.5, 0.25],
        "q6_k": [0.125],
    }[name]
    for off, v in zip(f16_offsets, pattern_scales):
        struct.pack_into("<e", pattern, off, v)
    out = [("pattern", bytes(pattern))]
    rng = random.Random(f"kquant-{name}")
    for k in range(2):
        b = bytearray(rng.getrandbits(8) for _ in range(size))
        for off in f16_offsets:
            struct.pack_into("<e", b, off, rng.choice(SCALES))
        out.append((f"random{k}", bytes(b)))
    return out


def as_f32(x):
    """x as float32, or an error when it is not exactly representable (the table must be exact)."""
    y = struct.unpack("<f", struct.pack("<f", x))[0]
    if y != x:
        raise ValueError(f"{x!r} is not exact in float32")
    return y


def table():
    out = {"comment": "Generated by scripts/kquant_values.py from the block layouts; do not edit.",
           "blocks": []}
    for name, (size, n, dequant, _) in FORMATS.items():
        for label, raw in blocks(name):
            values = dequant(raw)
            assert len(values) == n
            out["blocks"].append({"type": name, "label": label, "bytes": raw.hex(),
                                  "values": [as_f32(v) for v in values]})
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    g = ap.add_mutually_exclusive_group(required=True)
    g.add_argument("--write", metavar="FILE")
    g.add_argument("--check", metavar="FILE")
    a = ap.parse_args()
    want = table()
    if a.write:
        with open(a.write, "w") as f:  # one block per line
            f.write('{"comment": %s,\n "blocks": [\n' % json.dumps(want["comment"]))
            f.write(",\n".join("  " + json.dumps(b) for b in want["blocks"]))
            f.write("\n ]}\n")
        return 0
    with open(a.check) as f:
        have = json.load(f)
    bad = 0
    have_blocks = {(b["type"], b["label"]): b for b in have.get("blocks", [])}
    for b in want["blocks"]:
        key = (b["type"], b["label"])
        h = have_blocks.pop(key, None)
        if h is None:
            print(f"{a.check}: {key[0]} {key[1]}: missing")
            bad += 1
            continue
        if h["bytes"] != b["bytes"]:
            print(f"{a.check}: {key[0]} {key[1]}: block bytes differ")
            bad += 1
            continue
        for i, (x, y) in enumerate(zip(h["values"], b["values"])):
            if x != y or struct.pack("<f", x) != struct.pack("<f", y):
                print(f"{a.check}: {key[0]} {key[1]}: value {i} is {x}, the format gives {y}")
                bad += 1
        if len(h["values"]) != len(b["values"]):
            print(f"{a.check}: {key[0]} {key[1]}: {len(h['values'])} values, want {len(b['values'])}")
            bad += 1
    for key in have_blocks:
        print(f"{a.check}: {key[0]} {key[1]}: not a block this script makes")
        bad += 1
    n = len(want["blocks"])
    if bad:
        print(f"FAIL: {bad} differences in {a.check}")
        return 1
    print(f"ok: {n} blocks, {sum(len(b['values']) for b in want['blocks'])} values agree with "
          f"the block formats")
    return 0


if __name__ == "__main__":
    sys.exit(main())
