#!/usr/bin/env python3
"""Decode speed with a JSON-schema constraint against without, end to end through `kvasir serve`.

Starts `kvasir serve -m MODEL --stages N` and, ROUNDS times in alternation, streams a completion of
TOKENS tokens without a constraint (ignore_eos) and one under a JSON schema whose single string
property must be long (so the answer runs TOKENS tokens inside the grammar, where most tokens are
allowed and each draw is checked against it); decode speed is tokens after the first divided by
the time after the first. Prints medians and their ratio.

Usage: grammar_decode_bench.py KVASIR MODEL [--stages 1] [--tokens 128] [--rounds 5] [-t 2]
"""
import argparse
import json
import statistics
import sys
import time
import urllib.request

from serve_process import Serve

SCHEMA = {"type": "object",
          "properties": {"story": {"type": "string", "minLength": 4000, "maxLength": 8000}},
          "required": ["story"], "additionalProperties": False}


def decode_rate(url, tokens, constrained, seed):
    body = {"prompt": "Once upon a time", "max_tokens": tokens, "temperature": 0.8, "seed": seed,
            "stream": True, "stream_options": {"include_usage": True}}
    if constrained:
        body["response_format"] = {"type": "json_schema", "json_schema": {"name": "s",
                                                                          "schema": SCHEMA}}
    else:
        body["ignore_eos"] = True
    req = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    first = last = None
    usage = None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                usage = chunk["usage"]
            if chunk.get("choices") and chunk["choices"][0].get("text"):
                now = time.perf_counter()
                first = first or now
                last = now
    n = usage["completion_tokens"]
    return (n - 1) / (last - first), n


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvasir")
    ap.add_argument("model")
    ap.add_argument("--stages", type=int, default=1)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("-t", "--threads", type=int, default=2)
    args = ap.parse_args()
    serve_args = ["-m", args.model, "--stages", str(args.stages), "-t", str(args.threads),
                  "--cache-mb", "0"]
    with Serve(args.kvasir, serve_args) as server:
        url = server.url
        decode_rate(url, 8, True, 0)  # the vocabulary's trie is built on the first grammar
        plain, constrained = [], []
        for k in range(args.rounds):
            plain.append(decode_rate(url, args.tokens, False, k)[0])
            rate, n = decode_rate(url, args.tokens, True, k)
            if n != args.tokens:
                sys.exit(f"the constrained answer ended after {n} tokens, not {args.tokens}")
            constrained.append(rate)
    p, c = statistics.median(plain), statistics.median(constrained)
    print(f"{args.stages} stage(s), {args.tokens} tokens, {args.rounds} rounds, medians")
    print("| | decode tokens/s |")
    print("|---|---:|")
    print(f"| no constraint | {p:.1f} |")
    print(f"| JSON schema (inside a long string) | {c:.1f} |")
    print(f"ratio: {c / p:.2f}x")


if __name__ == "__main__":
    main()
