"""Load with disconnects: 200 concurrent streams on the fake engine, 40% of clients walking away.

Each client (httpx.AsyncClient, one connection each) streams a completion, a chat completion
or a TGI stream. 30% close the stream after a random number of events; 10% give up before the
first byte (a non-streaming request whose client times out while it is generating); the rest
read to the end. Oracles: no 5xx (429 would be counted, and none are expected with this
sizing); every surviving OpenAI stream has one finish reason per choice and ends with
`data: [DONE]`, every TGI stream's last event has `details.finish_reason`; afterwards /metrics
shows running = waiting = 0 and the KV blocks back at their baseline within a bounded wait,
each mid-stream leaver counted as an abort and each survivor as a `length` success.
"""

from __future__ import annotations

import asyncio
import json
import random
import time
from collections import Counter
from dataclasses import dataclass

import httpx
import pytest

from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer, metric

CLIENTS = 200
SHORT, LONG = 24, 200  # survivors' max_tokens; leavers' (so they are still running when they go)


@dataclass
class Outcome:
    role: str  # "survivor" | "mid_stream" | "early"
    status: int | None = None
    error: str | None = None


@pytest.fixture(scope="module")
def server():
    def engine() -> FakeEngine:
        return FakeEngine(
            max_model_len=256,
            max_num_seqs=CLIENTS,
            max_queued_requests=CLIENTS,
            num_blocks=CLIENTS * 80,
            step_delay=0.01,
        )

    with LiveServer(engine, admission_limit=CLIENTS + 16) as live:
        yield live


def _request(kind: str, max_tokens: int, stream: bool) -> tuple[str, dict]:
    if kind == "chat":
        messages = [{"role": "user", "content": "hello there"}]
        body = {"messages": messages, "max_tokens": max_tokens, "temperature": 0}
        return "/v1/chat/completions", {**body, "stream": stream}
    if kind == "tgi":
        return "/generate_stream" if stream else "/generate", {
            "inputs": "hello there",
            "parameters": {"max_new_tokens": max_tokens},
        }
    body = {"prompt": "hello there", "max_tokens": max_tokens, "temperature": 0}
    return "/v1/completions", {**body, "stream": stream}


def _check_stream(kind: str, datas: list[str]) -> str | None:
    """None when the stream ended properly, else what is wrong."""
    if kind == "tgi":
        last = json.loads(datas[-1]) if datas else {}
        return None if (last.get("details") or {}).get("finish_reason") else "no finish_reason"
    if not datas or datas[-1] != "[DONE]":
        return "no [DONE]"
    reasons = [c["finish_reason"] for d in datas[:-1] for c in json.loads(d)["choices"]]
    return None if [r for r in reasons if r] == ["length"] else f"finish reasons {reasons}"


async def _client(http: httpx.AsyncClient, rng: random.Random, role: str) -> Outcome:
    outcome = Outcome(role)
    kind = rng.choice(["completion", "chat", "tgi"])
    await asyncio.sleep(rng.uniform(0, 0.2))
    if role == "early":  # gives up while the server is still generating: no byte ever read
        path, body = _request(kind, LONG, stream=False)
        try:
            response = await http.post(path, json=body, timeout=rng.uniform(0.05, 0.3))
            outcome.status = response.status_code  # finished anyway: a valid answer
        except httpx.TimeoutException:
            pass
        return outcome
    path, body = _request(kind, LONG if role == "mid_stream" else SHORT, stream=True)
    leave_after = rng.randint(1, 12) if role == "mid_stream" else None
    async with http.stream("POST", path, json=body) as response:
        outcome.status = response.status_code
        if response.status_code != 200:
            await response.aread()
            return outcome
        datas: list[str] = []
        async for line in response.aiter_lines():
            if line.startswith("data: "):
                datas.append(line[len("data: ") :])
                if leave_after is not None and len(datas) >= leave_after:
                    return outcome  # leaving the block closes the connection mid-stream
        outcome.error = _check_stream(kind, datas)
    return outcome


async def _run(url: str, roles: list[str]) -> list[Outcome]:
    rng = random.Random(13)
    limits = httpx.Limits(max_connections=CLIENTS + 10, max_keepalive_connections=0)
    timeout = httpx.Timeout(30.0)
    async with httpx.AsyncClient(base_url=url, limits=limits, timeout=timeout) as http:
        tasks = [_client(http, random.Random(rng.random()), role) for role in roles]
        return await asyncio.wait_for(asyncio.gather(*tasks), timeout=90)


def _wait_idle(url: str, baseline_blocks: float, within: float) -> str:
    deadline = time.monotonic() + within
    while True:
        text = httpx.get(url + "/metrics").text
        idle = (
            metric(text, "tgserve_num_requests_running") == 0
            and metric(text, "tgserve_num_requests_waiting") == 0
            and metric(text, "tgserve_kv_cache_blocks_used") == baseline_blocks
        )
        if idle:
            return text
        assert time.monotonic() < deadline, "the server did not drain after the clients left"
        time.sleep(0.05)


def test_200_streams_with_disconnects_leave_nothing_behind(server):
    before = httpx.get(server.url + "/metrics").text
    baseline = metric(before, "tgserve_kv_cache_blocks_used")
    roles = ["early"] * 20 + ["mid_stream"] * 60 + ["survivor"] * 120
    random.Random(7).shuffle(roles)

    outcomes = asyncio.run(_run(server.url, roles))

    statuses = Counter(o.status for o in outcomes)
    assert not [s for s in statuses if s is not None and s >= 500], statuses
    assert statuses[429] == 0, statuses  # sized so that everyone is admitted
    survivors = [o for o in outcomes if o.role == "survivor"]
    assert all(o.status == 200 for o in survivors), statuses
    assert [o.error for o in survivors if o.error] == []
    after = _wait_idle(server.url, baseline, within=15)

    def delta(name: str, labels: dict[str, str] | None = None) -> float:
        try:
            return metric(after, name, labels) - metric(before, name, labels)
        except KeyError:  # a labelled counter appears with its first sample
            return metric(after, name, labels)

    model = {"model_name": server.state.model_names[0]}
    aborts = delta("tgserve_request_aborts_total", model)
    assert 60 <= aborts <= 80, aborts  # every mid-stream leaver; early ones if they got in
    assert delta("tgserve_request_success_total", {**model, "finish_reason": "length"}) == 120
