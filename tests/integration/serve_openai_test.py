#!/usr/bin/env python3
"""`kvasir serve` with the `openai` npm package as its client (serve_openai_test.mjs): a ring of
three `kvasir stage` processes of stories260K, `kvasir serve --ring` in front of it with an API key,
one that takes a single request at a time (429), and one in front of a ring that is not there
(503). Exit 77 (skipped) when node, npm's `openai` or the model is missing, a failure instead under
KVASIR_REQUIRE_ASSETS=1.

Usage: serve_openai_test.py KVASIR ASSETS NPM_DIR WORKDIR"""

import os
import shutil
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import serve_ring  # noqa: E402


def skip(why):
    if os.environ.get("KVASIR_REQUIRE_ASSETS") == "1":
        print(f"serve_openai_test: {why} (required: KVASIR_REQUIRE_ASSETS=1)")
        sys.exit(1)
    print(f"serve_openai_test: skipped: {why}")
    sys.exit(77)


def main():
    kvasir, assets, npm_dir, workroot = sys.argv[1:5]
    assets = os.environ.get("KVASIR_ASSETS", assets)
    kvasir, npm_dir = os.path.abspath(kvasir), os.path.abspath(npm_dir)
    model = os.path.join(assets, "models", "stories260K.gguf")
    if not os.path.exists(model):
        skip(f"{model} is missing")
    if shutil.which("node") is None:
        skip("node is missing (scripts/install-deps.sh --tests installs it)")
    if not os.path.isdir(os.path.join(npm_dir, "node_modules", "openai")):
        skip(f"the openai npm package is not in {npm_dir} (the serve_npm_setup test installs it)")
    os.makedirs(workroot, exist_ok=True)
    work = tempfile.mkdtemp(dir=workroot, prefix="serve-openai-")
    procs = serve_ring.Processes(work)
    nowhere = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        head, secret = serve_ring.start_ring(procs, kvasir, model, 3, 5, work)
        key = os.path.join(work, "api.key")
        with open(key, "w") as f:
            f.write("test-api-key-0123456789\n")
        os.chmod(key, 0o600)
        common = ["--ring", head, "--ring-secret-file", secret, "--vocab", model,
                  "--chat-template", "chatml", "--stats-interval", "0.05"]
        main_url = serve_ring.start_serve(procs, "serve", kvasir, common + [
            "--api-key-file", key, "--max-body", "64KiB", "--max-sessions", "16"])
        busy_url = serve_ring.start_serve(procs, "serve-busy", kvasir, common + [
            "--max-sessions", "1", "--max-waiting", "0"])
        # The same ring with Qwen3.5's tool format.
        qwen_url = serve_ring.start_serve(procs, "serve-qwen", kvasir, [
            "--ring", head, "--ring-secret-file", secret, "--vocab", model,
            "--chat-template", "qwen3.5"])
        # A head that is not there: a port bound here without listening refuses connections.
        nowhere.bind(("127.0.0.1", 0))
        down_url = serve_ring.start_serve(procs, "serve-down", kvasir, [
            "--ring", f"127.0.0.1:{nowhere.getsockname()[1]}", "--ring-secret-file", secret])
        serve_ring.wait_healthy(main_url)
        serve_ring.wait_healthy(busy_url)
        serve_ring.wait_healthy(qwen_url)
        env = dict(os.environ, KVASIR=kvasir, MODEL_FILE=model, NPM_DIR=npm_dir,
                   SERVE_URL=main_url, BUSY_URL=busy_url, DOWN_URL=down_url, QWEN_URL=qwen_url,
                   API_KEY="test-api-key-0123456789")
        test = os.path.join(os.path.dirname(os.path.abspath(__file__)), "serve_openai_test.mjs")
        r = subprocess.run(["node", test], env=env, timeout=600)
        if r.returncode != 0:
            for p in procs.procs:
                print(f"--- {p.log_path}:\n" + open(p.log_path, errors="replace").read()[-3000:])
        return r.returncode
    finally:
        procs.close()
        nowhere.close()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
