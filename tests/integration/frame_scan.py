#!/usr/bin/env python3
"""Counts the ring protocol's frame headers (docs/PROTOCOL.md, "Framing") that appear in the clear
in a file, such as a packet capture: 16 bytes, magic "KVR1", a known message id (1..13), flags 0,
a length of at most 64 MiB, reserved 0. Prints one line per message id found: "ID NAME COUNT".

  frame_scan.py FILE              the counts
  frame_scan.py --synthetic OUT   writes a HIDDEN frame (header and a 32-byte body) in the clear,
                                  as a link without encryption would send it: the check's own test
"""
import struct
import sys

MAGIC = b"KVR1"  # 0x3152564B little-endian
NAMES = {1: "HELLO", 2: "ERROR", 3: "GENERATE", 4: "OPEN_SESSION", 5: "HIDDEN", 6: "TOKEN",
         7: "CLOSE_SESSION", 8: "PING", 9: "PONG", 10: "STATS", 11: "HANDSHAKE", 12: "KEEPALIVE",
         13: "RECEIPT"}
MAX_PAYLOAD = 64 << 20


def scan(data):
    counts = {}
    at = data.find(MAGIC)
    while at >= 0:
        if at + 16 <= len(data):
            _, mtype, flags, length, reserved = struct.unpack_from("<IHHII", data, at)
            if mtype in NAMES and flags == 0 and reserved == 0 and length <= MAX_PAYLOAD:
                counts[mtype] = counts.get(mtype, 0) + 1
        at = data.find(MAGIC, at + 1)
    return counts


def main():
    if len(sys.argv) == 3 and sys.argv[1] == "--synthetic":
        body = struct.pack("<IIIIQQ", 7, 0, 1, 64 * 4, 0, 0)  # a HiddenBody-sized body
        with open(sys.argv[2], "wb") as f:
            f.write(struct.pack("<IHHII", 0x3152564B, 5, 0, len(body), 0) + body)
        return 0
    if len(sys.argv) != 2:
        print(__doc__, file=sys.stderr)
        return 2
    with open(sys.argv[1], "rb") as f:
        counts = scan(f.read())
    for mtype in sorted(counts):
        print(mtype, NAMES[mtype], counts[mtype])
    return 0


if __name__ == "__main__":
    sys.exit(main())
