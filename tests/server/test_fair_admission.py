"""Fair admission (server/fair_share.py): one client cannot starve another. A key that keeps
the server full still leaves a place to a key with nothing in flight; one request's prompt list
is at most a share of the in-flight limit; a `priority` ahead of the default is kept only for a
trusted key (`--priority-keys`), anyone else's is raised to 0.

Oracles: the status codes the contract names (429 + Retry-After, 400 naming `prompt`), the
fake engine's greedy text (a pure function of the prompt) and the priority the engine received.
"""

from __future__ import annotations

from contextlib import ExitStack

import httpx
import pytest

from tests.server.fake_engine import BOS, expected_greedy_text
from tests.server.live import LiveServer
from tests.server.test_priority import RecordingEngine

LIMIT = 16
GREEDY, POLITE, TRUSTED = "greedy-key", "polite-key", "trusted-key"


@pytest.fixture(scope="module")
def live():
    engine = RecordingEngine(
        max_model_len=1024, max_num_seqs=LIMIT + 1, num_blocks=300 * LIMIT, step_delay=0.01
    )
    keys = (GREEDY, POLITE, TRUSTED)
    settings = {"api_key": keys, "priority_keys": (TRUSTED,)}
    with LiveServer(lambda: engine, admission_limit=LIMIT, **settings) as server:
        yield server, engine


def _auth(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_a_key_that_fills_the_server_cannot_starve_another(live):
    server, _ = live
    long = {"prompt": "fill", "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.Client(base_url=server.url, timeout=30) as client, ExitStack() as stack:
        greedy_codes = []
        for _ in range(LIMIT + 4):  # as many as it can get, and then some
            response = stack.enter_context(
                client.stream("POST", "/v1/completions", json=long, headers=_auth(GREEDY))
            )
            greedy_codes.append(response.status_code)
        assert greedy_codes.count(200) < LIMIT  # the last places were kept
        refused = [code for code in greedy_codes if code != 200]
        assert refused and set(refused) == {429}
        body = {"prompt": "hello", "max_tokens": 5, "temperature": 0}
        polite = client.post("/v1/completions", json=body, headers=_auth(POLITE))
        assert polite.status_code == 200, polite.text
        assert polite.json()["choices"][0]["text"] == expected_greedy_text([BOS, *b"hello"], 5)


def test_the_greedy_key_is_told_to_retry(live):
    server, _ = live
    long = {"prompt": "fill", "max_tokens": 900, "temperature": 0, "stream": True}
    with httpx.Client(base_url=server.url, timeout=30) as client, ExitStack() as stack:
        last = None
        for _ in range(LIMIT + 1):
            last = stack.enter_context(
                client.stream("POST", "/v1/completions", json=long, headers=_auth(GREEDY))
            )
        assert last.status_code == 429 and int(last.headers["retry-after"]) >= 1


def test_one_request_lists_at_most_a_share_of_the_limit(live):
    server, _ = live
    share = LIMIT // 4
    body = {"prompt": ["p"] * (share + 1), "max_tokens": 2, "temperature": 0}
    too_many = httpx.post(server.url + "/v1/completions", json=body, headers=_auth(POLITE))
    assert too_many.status_code == 400 and too_many.json()["error"]["param"] == "prompt"
    body["prompt"] = ["p"] * share
    assert httpx.post(server.url + "/v1/completions", json=body, headers=_auth(POLITE)).is_success


def test_priority_ahead_of_the_default_needs_a_trusted_key(live):
    server, engine = live
    for key, asked, received in [(POLITE, -5, 0), (TRUSTED, -5, -5), (POLITE, 3, 3)]:
        before = len(engine.priorities)
        body = {"prompt": "hi", "max_tokens": 2, "priority": asked}
        response = httpx.post(server.url + "/v1/completions", json=body, headers=_auth(key))
        assert response.status_code == 200
        assert engine.priorities[before:] == [received]
