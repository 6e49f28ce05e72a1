"""API keys: Bearer auth on every route but the public ones; keys never reach a log."""

from __future__ import annotations

import logging

import httpx
import openai
import pytest

from server.settings import Settings
from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer

KEYS = ("first-secret-key", "second-secret-key")


@pytest.fixture(scope="module")
def server():
    with LiveServer(FakeEngine, api_key=KEYS) as live:
        yield live


def bearer(key: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {key}"}


def test_missing_or_wrong_key_is_401_in_the_route_family_shape(server):
    body = {"prompt": "hi", "max_tokens": 2}
    for headers in (
        {},
        bearer("nope"),
        bearer(KEYS[0][:-1]),
        {"Authorization": f"Basic {KEYS[0]}"},
    ):
        response = httpx.post(server.url + "/v1/completions", json=body, headers=headers)
        assert response.status_code == 401
        assert response.json()["error"]["code"] == "invalid_api_key"
        assert response.headers["www-authenticate"] == "Bearer"
    tgi = httpx.post(server.url + "/generate", json={"inputs": "hi"})
    assert tgi.status_code == 401 and tgi.json()["error_type"] == "authentication"
    assert httpx.get(server.url + "/v1/models").status_code == 401


def test_every_configured_key_is_accepted(server):
    for key in KEYS:
        response = httpx.post(
            server.url + "/v1/completions",
            json={"prompt": "hi", "max_tokens": 2},
            headers=bearer(key),
        )
        assert response.status_code == 200
    assert httpx.get(server.url + "/info", headers=bearer(KEYS[1])).status_code == 200


def test_probe_and_metrics_routes_need_no_key(server):
    for route in ("/health", "/ready", "/metrics"):
        assert httpx.get(server.url + route).status_code == 200


def test_the_openai_client_sends_its_key_as_bearer(server):
    good = openai.OpenAI(base_url=server.url + "/v1", api_key=KEYS[0], max_retries=0)
    assert good.models.list().data[0].id == "fake-model"
    bad = openai.OpenAI(base_url=server.url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.models.list()


def test_keys_never_appear_in_logs_or_in_the_settings_repr(server, caplog):
    caplog.set_level(logging.DEBUG)
    httpx.post(
        server.url + "/v1/completions",
        json={"prompt": "x", "max_tokens": 1},
        headers=bearer(KEYS[0]),
    )
    httpx.post(
        server.url + "/v1/completions",
        json={"prompt": "x", "max_tokens": 1},
        headers=bearer("guess"),
    )
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert all(key not in logged for key in KEYS)
    assert all(key not in repr(Settings(api_key=KEYS)) for key in KEYS)


def test_public_routes_are_configurable():
    with LiveServer(FakeEngine, api_key=KEYS, public_routes=("/health",)) as live:
        assert httpx.get(live.url + "/health").status_code == 200
        assert httpx.get(live.url + "/metrics").status_code == 401
        assert httpx.get(live.url + "/metrics", headers=bearer(KEYS[0])).status_code == 200
