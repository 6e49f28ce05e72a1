"""`tgserve serve --role prefill` and `--role decode`: two servers, each in a network namespace
made by the test (tests/netns.py), reaching each other only through their own 10.x addresses;
the prompt's K/V blocks go from the prefill server to the decode server over gloo.

Guarantees defended: greedy and seeded text through the decode server's HTTP equals the
one-process engine's; the decode server really did not prefill those prompts (its RAM-tier
hit counter holds every full block before each prompt's last token, and its transfer counter
says they came from the peer); the prefill server killed, the next request to the decode server fails at once with a
503 naming the prefill server (bounded time, asserted), and the decode server stays up, its
/metrics saying the transfer is down and its /ready answering 503 (routers look elsewhere).
Through an off-the-shelf router (sglang-router, as tests/deploy/test_router.py runs it) in
front of the decode server, a new prompt gets the one-process engine's greedy text, its blocks
again from the prefill server. One pair of servers serves every case: starting them is the cost.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

import httpx
import pytest

from tests import netns
from tests.deploy.test_router import _router
from tests.server.server_group import solo_texts, wait_ready

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["Hello world! How are you doing on this fine day", "The quick brown fox jumps over it"]
ROUTED = "Once upon a time there was a router in front"  # a prompt no server has seen
MAX_TOKENS = 12
SEEDED = {"temperature": 0.9, "seed": 7}
PORT, KV_PORT = 8000, 29600  # inside the namespaces: nothing else listens there
FAIL_BOUND_S = 10.0
RAM_HITS = 'tgserve_kv_offload_hits_total{tier="ram"}'
RECEIVED = 'tgserve_kv_transfer_blocks_total{role="decode"}'

pytestmark = pytest.mark.skipif(
    (reason := netns.unavailable()) is not None, reason=f"no network namespaces: {reason}"
)
SERVE = "-m server.cli serve --kv-cache-memory 4MB --block-size 4 --dtype float32 "
SERVE += "--max-num-seqs 8 --disable-cpu-kernels --host 0.0.0.0 --kv-transfer-timeout 60"


def _server(hosts: netns.Hosts, role: str, model: Path, log: Path):
    argv = [sys.executable, *SERVE.split(), "--model", str(model), "--port", str(PORT)]
    argv += ["--role", role, "--kv-transfer-addr", f"{hosts.addr[0]}:{KV_PORT}"]
    if role == "decode":
        argv += ["--prefill-url", f"http://{hosts.addr[1]}:{PORT}"]
    with log.open("w") as out:  # the process holds its own copy
        return hosts.run(0 if role == "decode" else 1, argv, cwd=ROOT, stdout=out, stderr=out)


def _texts(client: httpx.Client, extra: dict) -> tuple[list[str], int]:
    """The texts, and how many full blocks came before the prompts' last tokens."""
    texts, blocks = [], 0
    for prompt in PROMPTS:
        body = {"prompt": prompt, "max_tokens": MAX_TOKENS, **extra}
        reply = client.post("/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        texts.append(reply.json()["choices"][0]["text"])
        blocks += (reply.json()["usage"]["prompt_tokens"] - 1) // 4
    return texts, blocks


def _metric(client: httpx.Client, name: str) -> float:
    for line in client.get("/metrics").text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    raise AssertionError(f"no {name} in /metrics")


@pytest.fixture(scope="module")
def solo(tiny_model_folder) -> dict[str, list[str]]:
    """The one-process engine's greedy and seeded texts (`routed`: ROUTED's greedy): the oracle."""
    texts = solo_texts(tiny_model_folder, [*PROMPTS, ROUTED], MAX_TOKENS, SEEDED, cpu_kernels=False)
    return {
        "greedy": texts["greedy"][:-1],
        "seeded": texts["seeded"][:-1],
        "routed": texts["greedy"][-1],
    }


def test_decode_server_answers_as_one_server_on_the_peers_blocks_and_fails_fast_without_it(
    tiny_model_folder, solo, tmp_path
) -> None:
    with netns.hosts(2) as hosts:
        client = httpx.Client(base_url=f"http://{hosts.client_addr}:{PORT}", trust_env=False)
        logs = {"decode": tmp_path / "decode.log", "prefill": tmp_path / "prefill.log"}
        decode = _server(hosts, "decode", tiny_model_folder, logs["decode"])
        prefill = _server(hosts, "prefill", tiny_model_folder, logs["prefill"])
        wait_ready(client, decode, logs["decode"])
        hits = _metric(client, RAM_HITS)
        greedy, blocks = _texts(client, {"temperature": 0})
        assert greedy == solo["greedy"], logs["decode"].read_text()
        assert blocks > 0 and _metric(client, RAM_HITS) - hits == blocks  # loaded, not prefilled
        assert _metric(client, RECEIVED) == blocks  # and they came from the peer
        assert _texts(client, SEEDED)[0] == solo["seeded"]
        received = _metric(client, RECEIVED)
        with _router("round_robin", [f"http://{hosts.client_addr}:{PORT}"]) as router:
            model = client.get("/v1/models").json()["data"][0]["id"]  # the router wants one
            body = {"model": model, "prompt": ROUTED, "max_tokens": MAX_TOKENS, "temperature": 0}
            reply = httpx.post(f"{router}/v1/completions", json=body, timeout=60, trust_env=False)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == solo["routed"]
        assert _metric(client, RECEIVED) > received  # its blocks came from the prefill server
        prefill.kill()
        prefill.wait(30)
        t0 = time.monotonic()
        body = {"prompt": "A prompt the prefill server never sees", "max_tokens": 4}
        reply = client.post("/v1/completions", json=body, timeout=60)
        failed_after = time.monotonic() - t0
        assert reply.status_code == 503, reply.text
        error = reply.json()["error"]
        assert f"prefill server http://{hosts.addr[1]}:{PORT}" in error["message"]
        assert error["code"] == "prefill_unavailable" and failed_after < FAIL_BOUND_S
        assert decode.poll() is None and client.get("/health").status_code == 200
        assert _metric(client, 'tgserve_kv_transfer_up{role="decode"}') == 0
        ready = client.get("/ready")  # a router sends no more here
        assert (ready.status_code, ready.json()["status"]) == (503, "prefill_unavailable")
