"""Where a prompt's time to first token goes when a prefill server computes it for a decode
server (issue 45 item 3), against one server computing it alone: over HTTP only.

`python -m bench.pd_split [--model PATH] [--prompt-tokens 1024] [--runs 3] [--dtype D]
[--extra "FLAGS"]` starts three `tgserve serve` processes on loopback (one alone, one `--role
prefill`, one `--role decode`), waits for them to be ready, then for each run sends fresh seeded
prompts of `prompt-tokens` random ids (max_tokens 1, greedy): (1) to the lone server: its
TTFT; (2) to the prefill server's /kv_transfer/prefill directly: its compute and export times
(its reply); (3) to the decode server: the pair's TTFT, and, from the two servers' /metrics
around it, the seconds the prefill server's sender spent on the wire and the decode server
spent putting blocks into its RAM tier, and the bytes (so bytes per prompt token). Prints one
JSON line per run and one of medians; "decode_rest_ms" is the pair's TTFT less the prefill's
compute, export, wire and puts: the HTTP hops, the decode server's tier load and its tail.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import time

import httpx

from server.disagg import wait_until_ready

PORTS = {"solo": 18300, "prefill": 18301, "decode": 18302}
KV_ADDR = "127.0.0.1:18399"


def _start(role: str, args: argparse.Namespace) -> subprocess.Popen:
    argv = [sys.executable, "-m", "server.cli", "serve", "--host", "127.0.0.1"]
    argv += ["--port", str(PORTS[role]), "--dtype", args.dtype, *args.extra.split()]
    argv += ["--model", args.model] if args.model else []
    if role != "solo":
        argv += ["--role", role, "--kv-transfer-addr", KV_ADDR, "--kv-transfer-timeout", "600"]
    if role == "decode":
        argv += ["--prefill-url", f"http://127.0.0.1:{PORTS['prefill']}"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _metric(client: httpx.Client, url: str, name: str) -> float:
    for line in client.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


def _ttft(client: httpx.Client, url: str, prompt: list[int]) -> float:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    reply = client.post(url + "/v1/completions", json=body)
    reply.raise_for_status()
    return time.perf_counter() - t0


def one_run(client: httpx.Client, urls: dict[str, str], n: int, rng: random.Random) -> dict:
    prompts = [[rng.randrange(100, 1000) for _ in range(n)] for _ in range(3)]
    solo = _ttft(client, urls["solo"], prompts[0])
    body = {"prompt_token_ids": prompts[1], "transfer_id": rng.getrandbits(62)}
    direct = client.post(urls["prefill"] + "/kv_transfer/prefill", json=body).json()
    names = {
        "wire": (urls["prefill"], 'tgserve_kv_transfer_seconds_total{role="prefill"}'),
        "puts": (urls["decode"], 'tgserve_kv_transfer_seconds_total{role="decode"}'),
        "bytes": (urls["decode"], 'tgserve_kv_transfer_bytes_total{role="decode"}'),
    }
    before = {k: _metric(client, url, name) for k, (url, name) in names.items()}
    pair = _ttft(client, urls["decode"], prompts[2])
    after = {k: _metric(client, url, name) for k, (url, name) in names.items()}
    d = {k: after[k] - before[k] for k in names}
    rest = pair - direct["prefill_seconds"] - direct["export_seconds"] - d["wire"] - d["puts"]
    return {
        "solo_ttft_ms": solo * 1e3,
        "pair_ttft_ms": pair * 1e3,
        "prefill_compute_ms": direct["prefill_seconds"] * 1e3,
        "export_ms": direct["export_seconds"] * 1e3,
        "wire_ms": d["wire"] * 1e3,
        "decode_puts_ms": d["puts"] * 1e3,
        "decode_rest_ms": rest * 1e3,
        "bytes": d["bytes"],
        "bytes_per_prompt_token": d["bytes"] / (n - 1),  # the full blocks before the last
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--extra", default="--kv-cache-memory 512MB", help="flags for all three")
    args = parser.parse_args(argv)
    urls = {role: f"http://127.0.0.1:{port}" for role, port in PORTS.items()}
    procs = {role: _start(role, args) for role in PORTS}
    try:
        with httpx.Client(timeout=900, trust_env=False) as client:
            for role, proc in procs.items():
                wait_until_ready(urls[role], 900, lambda p=proc: p.poll() is None)
            rng = random.Random(0)
            runs = [one_run(client, urls, args.prompt_tokens, rng) for _ in range(args.runs)]
            for run in runs:
                print(json.dumps({k: round(v, 1) for k, v in run.items()}))
            medians = {k: round(statistics.median(r[k] for r in runs), 1) for k in runs[0]}
            print(json.dumps({"median": medians, "prompt_tokens": args.prompt_tokens}))
    finally:
        for proc in procs.values():
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    main()
