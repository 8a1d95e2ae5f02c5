"""A `kvasir serve` process for the API benchmarks: started on a free loopback port, waited for
until /health answers 200, stopped at the end."""
import socket
import subprocess
import sys
import time
import urllib.request


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Serve:
    """`kvasir serve ARGS --listen 127.0.0.1:PORT` as a context manager; `url` is its base URL."""

    def __init__(self, kvasir, args, deadline_s=180, stderr=subprocess.DEVNULL):
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([kvasir, "serve", *args, "--listen", f"127.0.0.1:{port}",
                                      "--log-level", "warn"],
                                     stdout=subprocess.DEVNULL, stderr=stderr)
        end = time.time() + deadline_s
        while time.time() < end:
            if self.proc.poll() is not None:
                sys.exit(f"kvasir serve exited with {self.proc.returncode}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except Exception:
                pass
            time.sleep(0.2)
        self.proc.terminate()
        sys.exit("kvasir serve did not become ready")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.proc.terminate()
        self.proc.wait()
