"""Where a prompt's time to first token goes when a prefill server computes it for a decode
server (issue 45 item 3), against one server computing it alone: over HTTP only.

`python -m bench.pd_split [--model PATH] [--prompt-tokens 1024] [--runs 3] [--dtype D]
[--block-size 16] [--extra "FLAGS"]` starts three `tgserve serve` processes on loopback (one alone, one `--role
prefill`, one `--role decode`), waits for them to be ready, then for each run sends fresh seeded
prompts of `prompt-tokens` random ids (max_tokens 1, greedy): (1) to the lone server: its
TTFT; (2) to the prefill server's /kv_transfer/prefill directly: its export time (its reply;
its blocks are let land before (3)); (3) to the decode server: the pair's TTFT, split by the
two servers' /metrics around it into the prefill server's compute (its TTFT), its sender's
seconds on the wire, the decode server's puts into its RAM tier, and its engine's TTFT (the
tier load, the tail's forward, the first token), with the bytes moved (per prompt token: the
full blocks before the last token). "rest_ms" is what is left: the HTTP hops, the export,
admission. Prints one JSON line per run and one of medians.
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
    argv += ["--block-size", str(args.block_size)]
    argv += ["--model", args.model] if args.model else []
    if role != "solo":
        argv += ["--role", role, "--kv-transfer-addr", KV_ADDR, "--kv-transfer-timeout", "600"]
    if role == "decode":
        argv += ["--prefill-url", f"http://127.0.0.1:{PORTS['prefill']}"]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def _metric(client: httpx.Client, url: str, name: str) -> float:
    """The sum of `name`'s samples (any labels when `name` has none)."""
    total = 0.0
    for line in client.get(url + "/metrics").text.splitlines():
        if line.startswith(name + " ") or ("{" not in name and line.startswith(name + "{")):
            total += float(line.split()[-1])
    return total


def _wait_for(client: httpx.Client, url: str, name: str, at_least: float) -> None:
    deadline = time.monotonic() + 120
    while _metric(client, url, name) < at_least and time.monotonic() < deadline:
        time.sleep(0.05)


def _ttft(client: httpx.Client, url: str, prompt: list[int]) -> float:
    body = {"prompt": prompt, "max_tokens": 1, "temperature": 0}
    t0 = time.perf_counter()
    reply = client.post(url + "/v1/completions", json=body)
    reply.raise_for_status()
    return time.perf_counter() - t0


def one_run(
    client: httpx.Client, urls: dict[str, str], n: int, block_size: int, rng: random.Random
) -> dict:
    prompts = [[rng.randrange(100, 1000) for _ in range(n)] for _ in range(3)]
    solo = _ttft(client, urls["solo"], prompts[0])
    received = 'tgserve_kv_transfer_blocks_total{role="decode"}'
    got = _metric(client, urls["decode"], received)
    body = {"prompt_token_ids": prompts[1], "transfer_id": rng.getrandbits(62)}
    direct = client.post(urls["prefill"] + "/kv_transfer/prefill", json=body).json()
    _wait_for(client, urls["decode"], received, got + direct["blocks"])  # landed, not in (3)
    ttft = "tgserve_time_to_first_token_seconds_sum"
    names = {
        "prefill_ttft": (urls["prefill"], ttft),
        "wire": (urls["prefill"], 'tgserve_kv_transfer_seconds_total{role="prefill"}'),
        "puts": (urls["decode"], 'tgserve_kv_transfer_seconds_total{role="decode"}'),
        "decode_ttft": (urls["decode"], ttft),
        "bytes": (urls["decode"], 'tgserve_kv_transfer_bytes_total{role="decode"}'),
        "rejected": (urls["decode"], 'tgserve_kv_transfer_rejected_batches_total{role="decode"}'),
    }
    before = {k: _metric(client, url, name) for k, (url, name) in names.items()}
    pair = _ttft(client, urls["decode"], prompts[2])
    after = {k: _metric(client, url, name) for k, (url, name) in names.items()}
    d = {k: after[k] - before[k] for k in names}
    parts = d["prefill_ttft"] + d["wire"] + d["puts"] + d["decode_ttft"]
    return {
        "solo_ttft_ms": solo * 1e3,
        "pair_ttft_ms": pair * 1e3,
        "prefill_compute_ms": d["prefill_ttft"] * 1e3,
        "export_ms": direct["export_seconds"] * 1e3,
        "wire_ms": d["wire"] * 1e3,
        "decode_puts_ms": d["puts"] * 1e3,
        "decode_engine_ttft_ms": d["decode_ttft"] * 1e3,
        "rest_ms": (pair - parts) * 1e3,
        "bytes": d["bytes"],
        "rejected_batches": d["rejected"],  # > 0: another forward path's K/V, recomputed
        "bytes_per_token": d["bytes"] / ((n - 1) // block_size * block_size),  # the full blocks
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None)
    parser.add_argument("--prompt-tokens", type=int, default=1024)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--extra", default="--kv-cache-memory 512MB", help="flags for all three")
    args = parser.parse_args(argv)
    urls = {role: f"http://127.0.0.1:{port}" for role, port in PORTS.items()}
    procs = {role: _start(role, args) for role in PORTS}
    try:
        with httpx.Client(timeout=900, trust_env=False) as client:
            for role, proc in procs.items():
                wait_until_ready(urls[role], 900, lambda p=proc: p.poll() is None)
            rng = random.Random(0)
            runs = [
                one_run(client, urls, args.prompt_tokens, args.block_size, rng)
                for _ in range(args.runs)
            ]
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
