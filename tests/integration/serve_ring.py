"""Processes for the `kvasir serve` end-to-end tests: a ring of `kvasir stage` processes on
loopback ports bound here and inherited (--listen-fd, so no port is ever free for another process
to take), and `kvasir serve` instances whose "serve: listening on HOST:PORT" line is waited for.
Every wait has a deadline; every process is killed at the end."""

import json
import os
import re
import secrets
import socket
import subprocess
import time
import urllib.error
import urllib.request

DEADLINE_S = 60


class Processes:
    """Starts processes with their stderr in `logdir`, and ends them all on close."""

    def __init__(self, logdir):
        self.logdir = logdir
        self.procs = []

    def start(self, name, args, pass_fds=()):
        log = open(os.path.join(self.logdir, name + ".log"), "wb")
        p = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=log, pass_fds=pass_fds)
        p.log_path = log.name
        self.procs.append(p)
        return p

    def close(self):
        for p in self.procs:
            if p.poll() is None:
                p.terminate()
        for p in self.procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def bound_sockets(n):
    out = []
    for _ in range(n):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        s.bind(("127.0.0.1", 0))
        s.listen(64)
        s.set_inheritable(True)
        out.append(s)
    return out


def start_ring(procs, kvasir, model, n_stages, n_layer, workdir, log_level="warn"):
    """A ring of `n_stages` stage processes; returns (head "HOST:PORT", secret file)."""
    secret = os.path.join(workdir, "ring.secret")
    with open(secret, "w") as f:
        f.write(secrets.token_hex(32) + "\n")
    os.chmod(secret, 0o600)
    socks = bound_sockets(n_stages)
    for i in range(n_stages):
        first, last = i * n_layer // n_stages, (i + 1) * n_layer // n_stages
        nxt = socks[(i + 1) % n_stages].getsockname()[1]
        procs.start(f"stage{i}", [
            kvasir, "stage", "-m", model, "--layers", f"{first}:{last}",
            "--listen-fd", str(socks[i].fileno()), "--next", f"127.0.0.1:{nxt}",
            "--name", f"stage{i}", "-t", "1", "--ring-secret-file", secret,
            "--key", os.path.join(workdir, f"stage{i}.key"), "--log-level", log_level],
            pass_fds=[socks[i].fileno()])
    head = f"127.0.0.1:{socks[0].getsockname()[1]}"
    for s in socks:
        s.close()  # the stages hold their copies
    return head, secret


def start_serve(procs, name, kvasir, args):
    """Starts `kvasir serve ARGS --listen 127.0.0.1:0`; returns its base URL once it listens."""
    p = procs.start(name, [kvasir, "serve", "--listen", "127.0.0.1:0"] + args)
    deadline = time.time() + DEADLINE_S
    while time.time() < deadline:
        with open(p.log_path, "rb") as f:
            m = re.search(rb"serve: listening on (\S+):(\d+)", f.read())
        if m:
            return f"http://127.0.0.1:{int(m.group(2))}"
        if p.poll() is not None:
            raise RuntimeError(f"{name} exited ({p.returncode}): {open(p.log_path).read()}")
        time.sleep(0.05)
    raise RuntimeError(f"{name} did not listen within {DEADLINE_S} s")


def wait_healthy(base, key=None):
    """Waits until /health answers 200; returns its JSON."""
    deadline = time.time() + DEADLINE_S
    last = ""
    while time.time() < deadline:
        try:
            with urllib.request.urlopen(base + "/health", timeout=5) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            last = e.read().decode(errors="replace")
        except OSError as e:
            last = str(e)
        time.sleep(0.05)
    raise RuntimeError(f"{base}/health never answered 200: {last}")
