#!/usr/bin/env python3
"""Load for `kvasir serve` against the same ring used directly: C concurrent clients, each with its
own ~130-token prompt, generating N tokens greedily past end-of-generation tokens.

- `api`: C threads each stream one completion from `kvasir serve` (stdlib HTTP, SSE parsed as it
  arrives); time to first token is from sending the request to its first text chunk.
- `ring`: C `kvasir generate --ring` processes at once, each reporting its own time to first token
  and decode rate (--stats).

Per client: TTFT, and decode tokens/s = (tokens - 1) / (last token - first token). Aggregate: all
generated tokens over the wall time of the round (prefills included). Prints one JSON line.
Usage: serve_load.py api URL CLIENTS N | serve_load.py ring KVASIR HEAD SECRET CLIENTS N"""

import http.client
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse

STORY = ("Once upon a time there was a little girl named Lily who lived in a small house near the "
         "woods with her mother, her father and a fat old cat. Every morning she walked to the "
         "river to look at the fish, and every evening she told her cat what she had seen. One "
         "day she found a shiny blue stone under a tree, and she wondered where it came from and "
         "who had left it there.")


def prompt(i):
    return f"Story {i}. " + STORY


def api_client(url, i, n, out):
    u = urllib.parse.urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=600)
    body = json.dumps({"prompt": prompt(i), "max_tokens": n, "temperature": 0, "ignore_eos": True,
                       "stream": True, "stream_options": {"include_usage": True}})
    t0 = time.monotonic()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    r = conn.getresponse()
    if r.status != 200:
        raise RuntimeError(f"client {i}: HTTP {r.status}: {r.read()[:300]}")
    first = last = None
    tokens = 0
    buf = b""
    while True:
        chunk = r.read1(65536)
        if not chunk:
            break
        buf += chunk
        while b"\n\n" in buf:
            event, buf = buf.split(b"\n\n", 1)
            data = event[6:]
            if data == b"[DONE]":
                continue
            j = json.loads(data)
            if j.get("usage"):
                tokens = j["usage"]["completion_tokens"]
            if j["choices"] and j["choices"][0]["text"]:
                now = time.monotonic()
                first = first or now
                last = now
    conn.close()
    out[i] = {"ttft_ms": (first - t0) * 1e3, "tokens": tokens,
              "decode_tps": (tokens - 1) / (last - first) if last > first else 0.0}


def run_api(url, clients, n):
    out = [None] * clients
    threads = [threading.Thread(target=api_client, args=(url, i, n, out)) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out, time.monotonic() - t0


def run_ring(kvasir, head, secret, clients, n):
    work = tempfile.mkdtemp()
    procs = []
    t0 = time.monotonic()
    for i in range(clients):
        stats = os.path.join(work, f"{i}.json")
        procs.append((stats, subprocess.Popen(
            [kvasir, "generate", "--ring", head, "--ring-secret-file", secret, "-p", prompt(i),
             "-n", str(n), "--temp", "0", "--ignore-eos", "--stats", stats],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)))
    out = []
    for stats, p in procs:
        if p.wait() != 0:
            raise RuntimeError(f"kvasir generate --ring exited {p.returncode}")
        j = json.load(open(stats))
        out.append({"ttft_ms": j["ttft_ms"], "tokens": j["n_generated"],
                     "decode_tps": j["decode_tokens_per_s"]})
    return out, time.monotonic() - t0


def main():
    mode = sys.argv[1]
    if mode == "api":
        url, clients, n = sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
        out, wall = run_api(url, clients, n)
    else:
        kvasir, head, secret, clients, n = sys.argv[2:5] + [int(sys.argv[5]), int(sys.argv[6])]
        out, wall = run_ring(kvasir, head, secret, clients, n)
    print(json.dumps({
        "mode": mode, "clients": clients,
        "ttft_ms_median": statistics.median(o["ttft_ms"] for o in out),
        "ttft_ms_max": max(o["ttft_ms"] for o in out),
        "decode_tps_median": statistics.median(o["decode_tps"] for o in out),
        "aggregate_tps": sum(o["tokens"] for o in out) / wall,
        "tokens": sum(o["tokens"] for o in out), "wall_s": wall}))


if __name__ == "__main__":
    main()
