#!/usr/bin/env python3
"""Recomputes the receipt known-answer vector of tests/ring/receipt_test.cpp (KnownAnswerVector)
from docs/PROTOCOL.md, "RECEIPT", without any of Kvasir's code: the layout in plain Python, the
Ed25519 keys and signatures with the openssl command. Exits 0 when the vector in the C++ test is
exactly what the protocol gives, 1 (with both) when it is not.

Usage: receipt_vector.py tests/ring/receipt_test.cpp
"""
import os
import re
import struct
import subprocess
import sys
import tempfile

# PKCS#8 and SubjectPublicKeyInfo prefixes of an Ed25519 key (RFC 8410).
PKCS8_PREFIX = bytes.fromhex("302e020100300506032b657004220420")
SPKI_PREFIX = bytes.fromhex("302a300506032b6570032100")


def openssl(args, data=None):
    return subprocess.run(["openssl"] + args, input=data, capture_output=True, check=True).stdout


class Key:
    def __init__(self, seed, workdir):
        self.path = os.path.join(workdir, seed.hex() + ".der")
        with open(self.path, "wb") as f:
            f.write(PKCS8_PREFIX + seed)
        spki = openssl(["pkey", "-inform", "DER", "-in", self.path, "-pubout", "-outform", "DER"])
        assert spki.startswith(SPKI_PREFIX) and len(spki) == len(SPKI_PREFIX) + 32, spki.hex()
        self.public = spki[len(SPKI_PREFIX):]

    def sign(self, message, workdir):
        msg = os.path.join(workdir, "message")
        with open(msg, "wb") as f:
            f.write(message)
        sig = openssl(["pkeyutl", "-sign", "-inkey", self.path, "-keyform", "DER", "-rawin",
                       "-in", msg])
        assert len(sig) == 64
        return sig


def body(session, n_lines, receipt_id, model_id):
    # ReceiptBody: session u32, n_lines u32, receipt_id[16], model_id[16], version u32 (2),
    # reserved[4].
    return struct.pack("<II", session, n_lines) + receipt_id + model_id + struct.pack("<I", 2) + \
        bytes(4)


def receipt(session, receipt_id, model_id, lines, workdir):
    """lines: (key, first, last, tokens, rows_root) in ring order."""
    signed = []
    for i, (key, first, last, tokens, rows_root) in enumerate(lines):
        # node_key[32], first u32, last u32, tokens u64, rows_root[32], reserved[8]: the 88 bytes
        # before the signature, which covers the body with n_lines = i + 1, the lines before, and
        # these.
        head = key.public + struct.pack("<IIQ", first, last, tokens) + rows_root + bytes(8)
        message = (b"kvasir-receipt-v2\x00" + body(session, i + 1, receipt_id, model_id) +
                   b"".join(signed) + head)
        signed.append(head + key.sign(message, workdir))
    return body(session, len(lines), receipt_id, model_id) + b"".join(signed)


def expected_from(test_source):
    text = open(test_source, encoding="utf-8").read()
    m = re.search(r"TEST\(ReceiptTest, KnownAnswerVector\).*?const std::string expected =(.*?);",
                  text, re.S)
    if not m:
        sys.exit(f"{test_source}: no KnownAnswerVector with a `const std::string expected`")
    return "".join(re.findall(r'"([0-9a-f]*)"', m.group(1)))


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    want = expected_from(sys.argv[1])
    with tempfile.TemporaryDirectory() as workdir:
        # ThreeLines() of the C++ test: keys from seeds (i * 32 + j), id 00..0f, model a0..af,
        # session 7, a 5-layer model on [0,2) [2,4) [4,5), 20 rows each, line i's rows_root the
        # bytes 0x80 + 0x20 i + j.
        keys = [Key(bytes(i * 32 + j for j in range(32)), workdir) for i in range(3)]
        roots = [bytes(0x80 + 0x20 * i + j for j in range(32)) for i in range(3)]
        got = receipt(7, bytes(range(16)), bytes(0xA0 + i for i in range(16)),
                      [(keys[0], 0, 2, 20, roots[0]), (keys[1], 2, 4, 20, roots[1]),
                       (keys[2], 4, 5, 20, roots[2])],
                      workdir).hex()
    if got != want:
        print(f"the vector in {sys.argv[1]}:\n{want}\nthe protocol gives:\n{got}")
        return 1
    print(f"receipt vector: {len(got) // 2} bytes, the same as the protocol gives")
    return 0


if __name__ == "__main__":
    sys.exit(main())
