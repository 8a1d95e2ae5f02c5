#!/usr/bin/env python3
"""Time to first token of a chat's second turn with the ring's prompt cache, against a short prompt.

Starts `kvasir serve -m MODEL --stages N` twice (prompt cache on, then --cache-mb 0), and through
the OpenAI API (streamed chat completions, greedy) measures for each of ROUNDS fresh
conversations: the time to first token of a prompt of about 20 tokens, and of the second turn of
a chat whose history is about HISTORY tokens (the first turn's prompt and answer, then a new
question). Prints a table of medians, the cached token counts, and whether the second turn's
text equals the uncached server's.

Usage: prompt_cache_bench.py KVASIR MODEL [--stages 3] [--history 1000] [--rounds 3] [-t 1]
           [--ctx 2048] [--serve-arg ARG]... [--trace LOG]
"""
import argparse
import json
import random
import statistics
import sys
import time
import urllib.request

import trace_timing
from serve_process import Serve

WORDS = ("river stone lantern quiet meadow orange violin harbor pepper cloud basket mirror "
         "garden thunder pencil candle forest silver window ladder ocean velvet copper needle "
         "marble island feather wagon saddle tunnel").split()


def chat(url, messages, max_tokens):
    """Streams a greedy chat completion: (seconds to the first content, text, usage, its id)."""
    body = json.dumps({"messages": messages, "max_tokens": max_tokens, "temperature": 0,
                       "stream": True, "stream_options": {"include_usage": True}}).encode()
    req = urllib.request.Request(url + "/v1/chat/completions", data=body,
                                 headers={"Content-Type": "application/json"})
    t0 = time.perf_counter()
    ttft = None
    text, usage, answer_id = "", None, None
    with urllib.request.urlopen(req, timeout=600) as r:
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            answer_id = chunk.get("id", answer_id)
            if chunk.get("usage"):
                usage = chunk["usage"]
            for c in chunk.get("choices", []):
                if c["delta"].get("content") is not None and ttft is None and "role" not in c["delta"]:
                    ttft = time.perf_counter() - t0
                text += c["delta"].get("content") or ""
    return ttft, text, usage, answer_id


def words(rng, n):
    return " ".join(rng.choice(WORDS) for _ in range(n))


def measure(args, cache_mb, trace=None):
    serve_args = ["-m", args.model, "--stages", str(args.stages), "-t", str(args.threads), "-c",
                  str(args.ctx), "--chat-template", "chatml", "--cache-mb", str(cache_mb)]
    serve_args += args.serve_arg
    if trace is not None:
        serve_args.append("--trace-timing")
    with Serve(args.kvasir, serve_args, **({"stderr": trace} if trace else {})) as server:
        url = server.url
        rows = []
        for k in range(args.rounds):
            rng = random.Random(1000 + k)
            short_ttft, _, short_usage, short_id = chat(url, [{"role": "user", "content": words(rng, 14)}], 4)
            history = [{"role": "user", "content": words(rng, args.history)}]
            _, answer, first_usage, _ = chat(url, history, 16)
            history += [{"role": "assistant", "content": answer},
                        {"role": "user", "content": words(rng, 12)}]
            ttft, text, usage, turn2_id = chat(url, history, 16)
            rows.append({"short_ttft": short_ttft, "short_prompt": short_usage["prompt_tokens"],
                         "short_cached": short_usage["prompt_tokens_details"]["cached_tokens"],
                         "first_prompt": first_usage["prompt_tokens"], "ttft": ttft, "text": text,
                         "prompt": usage["prompt_tokens"], "short_id": short_id, "id": turn2_id,
                         "cached": usage["prompt_tokens_details"]["cached_tokens"]})
        return rows


def print_phases(log, rows):
    """The median of each phase (bench/trace_timing.py) of the short prompts and the turn 2s."""
    with open(log) as f:
        reqs = trace_timing.requests(trace_timing.parse(f))
    cols = {}
    for key, name in (("short_id", "short prompt"), ("id", "turn 2, cache on")):
        got = [trace_timing.phases(reqs[r[key]]) for r in rows if r[key] in reqs]
        got = [g for g in got if g]
        names = list(dict.fromkeys(k for g in got for k in g))
        cols[name] = {k: statistics.median(g.get(k, 0.0) for g in got) for k in names}
    names = list(dict.fromkeys(k for c in cols.values() for k in c))
    print("| phase (median ms) | " + " | ".join(cols) + " |")
    print("|---|" + "---:|" * len(cols))
    for k in names:
        print(f"| {k} | " + " | ".join(f"{c.get(k, 0.0):.1f}" for c in cols.values()) + " |")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("kvasir")
    ap.add_argument("model")
    ap.add_argument("--stages", type=int, default=3)
    ap.add_argument("--history", type=int, default=1000, help="words in the first turn (~tokens)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("-t", "--threads", type=int, default=1)
    ap.add_argument("--ctx", type=int, default=2048,
                    help="the context of each server (-c): above the history's tokens")
    ap.add_argument("--serve-arg", action="append", default=[],
                    help="one more argument for both servers (repeat for several)")
    ap.add_argument("--trace", metavar="LOG",
                    help="run the cached server with --trace-timing into LOG and print the "
                         "median phases of the short prompt and turn 2 (bench/trace_timing.py)")
    args = ap.parse_args()
    if args.trace:
        with open(args.trace, "w") as log:
            cached = measure(args, 256, log)
    else:
        cached = measure(args, 256)
    plain = measure(args, 0)
    med = lambda rows, key: statistics.median(r[key] for r in rows)
    same = all(a["text"] == b["text"] for a, b in zip(cached, plain))
    print(f"{args.stages} stages, {args.rounds} conversations, medians")
    print("| | prompt tokens | cached | time to first token |")
    print("|---|---:|---:|---:|")
    print(f"| short prompt | {med(cached, 'short_prompt'):.0f} | {med(cached, 'short_cached'):.0f} | "
          f"{med(cached, 'short_ttft') * 1e3:.0f} ms |")
    print(f"| turn 2, prompt cache on | {med(cached, 'prompt'):.0f} | {med(cached, 'cached'):.0f} | "
          f"{med(cached, 'ttft') * 1e3:.0f} ms |")
    print(f"| turn 2, --cache-mb 0 | {med(plain, 'prompt'):.0f} | {med(plain, 'cached'):.0f} | "
          f"{med(plain, 'ttft') * 1e3:.0f} ms |")
    if args.trace:
        print_phases(args.trace, cached)
    ratio = med(cached, "ttft") / med(cached, "short_ttft")
    print(f"turn 2 / short prompt: {ratio:.2f}x; turn 2 text equal with and without the cache: {same}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
