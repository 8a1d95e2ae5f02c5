#!/usr/bin/env python3
"""Merges the `--trace-timing` lines of `kvasir serve` and its stages into one timeline per request.

Each traced line is `[timing] <unix us> <who> <event> key=value ...` (src/base/timing_trace.h).
A request is followed from serve's `accepted` through the head (`generate_in`, `open_out`), every
stage (`hidden_in`, `compute_start`, `compute_end`, `hidden_out`; the last stage's `token_out`) and
back (`token_in` at the head, serve's `first_token` and `first_text`), up to its first token.

Usage: trace_timing.py LOG     prints each request's steps, in ms from serve's `accepted`
"""
import sys
from collections import defaultdict


def parse(lines):
    """The traced events: dicts with t (seconds), who, event and the key=value fields."""
    events = []
    for line in lines:
        i = line.find("[timing] ")
        if i < 0:
            continue
        parts = line[i + 9:].split()
        if len(parts) < 3:
            continue
        e = {"t": int(parts[0]) / 1e6, "who": parts[1], "event": parts[2]}
        for kv in parts[3:]:
            k, _, v = kv.partition("=")
            e[k] = v
        events.append(e)
    return events


def requests(events):
    """Each request's events up to its first text, in time order, keyed by serve's request id.

    Serve's lines carry `req`, the stages' carry `session`; serve's first_token names both. The
    head's generate_in (before the session has an id) is matched by its client to the open_out
    that follows it."""
    session_of = {e["req"]: e["session"] for e in events if e["event"] == "first_token"}
    by_session = defaultdict(list)
    pending_generate = {}
    for e in events:
        if e["event"] == "generate_in":
            pending_generate[(e["who"], e["client"])] = e
        elif "session" in e:
            if e["event"] == "open_out" and "client" in e:
                g = pending_generate.pop((e["who"], e["client"]), None)
                if g is not None:
                    by_session[e["session"]].append(g)
            by_session[e["session"]].append(e)
    out = {}
    for req, session in session_of.items():
        evs = [e for e in events if e.get("req") == req and "session" not in e]
        evs += by_session.get(session, [])
        evs.sort(key=lambda e: e["t"])
        # Only the steps up to the first text: decode steps after it are not part of TTFT.
        cut = next((i for i, e in enumerate(evs) if e["event"] == "first_text"), len(evs) - 1)
        out[req] = evs[:cut + 1]
    return out


def label(e):
    extra = ""
    if "rows" in e:
        extra = f" pos0={e.get('pos0')} rows={e['rows']}"
    elif "pos" in e:
        extra = f" pos={e['pos']}"
    return f"{e['who']} {e['event']}{extra}"


def steps(evs):
    """(label, ms from accepted, ms since the step before) for one request's events."""
    t0 = next((e["t"] for e in evs if e["event"] == "accepted"), evs[0]["t"])
    rows, prev = [], t0
    for e in evs:
        rows.append((label(e), (e["t"] - t0) * 1e3, (e["t"] - prev) * 1e3))
        prev = e["t"]
    return rows


def phases(evs):
    """One request's time to first text in phases (ms): serve before the head, the head's open
    (tokenizing, the cache lookup, taking the kept state over), each stage's compute of the
    prompt's rows, the first token's way back to the stream, and the rest."""
    first = lambda who, event: next(
        (e["t"] for e in evs if e["event"] == event and (who is None or e["who"] == who)), None)
    t_acc, t_text = first("serve", "accepted"), first("serve", "first_text")
    gen = next((e for e in evs if e["event"] == "generate_in"), None)
    if t_acc is None or t_text is None or gen is None:
        return None
    out = {"total": (t_text - t_acc) * 1e3}
    out["serve in"] = (gen["t"] - t_acc) * 1e3
    out["head open"] = (first(gen["who"], "open_out") - gen["t"]) * 1e3
    t_token = first(None, "token_out")
    started = {}
    for e in evs:
        if t_token is not None and e["t"] > t_token:
            break
        key = (e["who"], e.get("pos0"))
        if e["event"] == "compute_start":
            started[key] = e["t"]
        elif e["event"] == "compute_end" and key in started:
            name = f"{e['who']} compute"
            out[name] = out.get(name, 0.0) + (e["t"] - started.pop(key)) * 1e3
    if t_token is not None:
        out["token to text"] = (t_text - t_token) * 1e3
    # Hops, queues and waits for a core; negative where stages computed at once (chunks pipelined).
    out["rest"] = out["total"] - sum(v for k, v in out.items() if k != "total")
    return out


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    with open(sys.argv[1]) as f:
        reqs = requests(parse(f))
    for req, evs in reqs.items():
        acc = next((e for e in evs if e["event"] == "accepted"), {})
        print(f"{req}: {acc.get('body_bytes', '?')} body bytes, parse {acc.get('parse_us', '?')} us, "
              f"template {acc.get('template_us', '?')} us")
        for name, at, delta in steps(evs):
            print(f"  {at:9.1f} ms  (+{delta:7.1f})  {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
