"""`python -m bench.gpu_check.serve_stage [server flags] -- [bench serve flags]`: a serving load
on a `random:` shape, start to end in one process.

Contract: starts random_server.py on a free local port (a child in this process's group, so a
timeout that kills the group ends it too), waits until /ready answers 200 (failing with the
server's exit code if it dies first, or after `--ready-timeout` seconds), runs
`tgserve bench serve --url ... --served-model-name NAME [bench serve flags]` in this process
(its results on stdout, as that command prints them), then stops the server (SIGTERM, then
SIGKILL after 15 s). Exits with bench serve's code.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

from bench.random_models import random_shape


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, server: subprocess.Popen, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise RuntimeError(f"the server exited with code {server.returncode} before ready")
        try:
            with urllib.request.urlopen(url + "/ready", timeout=2) as response:
                if response.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"the server was not ready after {timeout_s:.0f} s")


def main(argv: list[str]) -> int:
    from server.cli import main as tgserve

    split = argv.index("--") if "--" in argv else len(argv)
    p = argparse.ArgumentParser(prog="serve_stage")
    p.add_argument("--model", required=True)
    p.add_argument("--ready-timeout", type=float, default=180.0)
    args, server_flags = p.parse_known_args(argv[:split])
    name, _ = random_shape(args.model)
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "bench.gpu_check.random_server", "--model", args.model]
    server = subprocess.Popen([*cmd, "--port", str(port), *server_flags])
    try:
        t0 = time.monotonic()
        wait_ready(url, server, args.ready_timeout)
        print(f"server ready in {time.monotonic() - t0:.1f} s", file=sys.stderr, flush=True)
        bench = ["bench", "serve", "--url", url, "--served-model-name", name]
        return tgserve([*bench, *argv[split + 1 :]])
    finally:
        server.terminate()
        try:
            server.wait(15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
