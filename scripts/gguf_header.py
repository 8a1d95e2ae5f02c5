"""A GGUF header reader in plain Python: metadata and tensor infos, no tensor data.

Independent of the C++ reader on purpose (scripts/quant_mix.py checks files the C++ code wrote).
The format: magic "GGUF", version (u32), tensor count and metadata count (u64), the metadata
key/value pairs, then one info per tensor (name, dims, ggml type, offset); little-endian.
"""
import struct

# ggml type ids (ggml.h) and their names as GGUF tools print them.
GGML_TYPES = {
    0: "f32", 1: "f16", 2: "q4_0", 3: "q4_1", 6: "q5_0", 7: "q5_1", 8: "q8_0", 9: "q8_1",
    10: "q2_k", 11: "q3_k", 12: "q4_k", 13: "q5_k", 14: "q6_k", 15: "q8_k", 16: "iq2_xxs",
    17: "iq2_xs", 18: "iq3_xxs", 19: "iq1_s", 20: "iq4_nl", 21: "iq3_s", 22: "iq2_s", 23: "iq4_xs",
    30: "bf16",
}

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q",
            11: "<q", 12: "<d"}


class _Reader:
    def __init__(self, f):
        self.f = f

    def take(self, fmt):
        size = struct.calcsize(fmt)
        raw = self.f.read(size)
        if len(raw) != size:
            raise ValueError("truncated GGUF header")
        return struct.unpack(fmt, raw)[0]

    def string(self):
        n = self.take("<Q")
        if n > 1 << 24:
            raise ValueError(f"string of {n} bytes")
        raw = self.f.read(n)
        if len(raw) != n:
            raise ValueError("truncated GGUF string")
        return raw.decode("utf-8", "replace")

    def value(self, vtype):
        if vtype in _SCALARS:
            return self.take(_SCALARS[vtype])
        if vtype == 8:
            return self.string()
        if vtype == 9:
            itype, n = self.take("<I"), self.take("<Q")
            return [self.value(itype) for _ in range(n)]
        raise ValueError(f"unknown GGUF value type {vtype}")


def read_header(path):
    """Returns (metadata dict, [(name, [ne...], type name)]) in file order."""
    with open(path, "rb") as f:
        r = _Reader(f)
        if f.read(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = r.take("<I")
        if version not in (2, 3):
            raise ValueError(f"{path}: GGUF version {version}")
        n_tensors, n_kv = r.take("<Q"), r.take("<Q")
        meta = {}
        for _ in range(n_kv):
            key = r.string()
            meta[key] = r.value(r.take("<I"))
        tensors = []
        for _ in range(n_tensors):
            name = r.string()
            n_dims = r.take("<I")
            ne = [r.take("<Q") for _ in range(n_dims)]
            ttype = r.take("<I")
            r.take("<Q")  # offset
            tensors.append((name, ne, GGML_TYPES.get(ttype, f"type{ttype}")))
        return meta, tensors
