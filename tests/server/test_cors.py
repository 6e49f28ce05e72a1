"""CORS: with --allowed-origins, a browser preflight from an allowed origin is answered before
auth (a keyed server included), actual requests and the errors they get (401, 503) carry
Access-Control-Allow-Origin, other origins get no CORS headers, and credentials are never
allowed. Without the flag no CORS header is ever sent.
"""

from __future__ import annotations

import httpx
import pytest

from server import serve
from server.settings import Settings
from tests.server.fake_engine import FakeEngine, expected_greedy_text
from tests.server.live import LiveServer

KEY = "cors-key"
APP = "https://app.example"
PREFLIGHT = {
    "Origin": APP,
    "Access-Control-Request-Method": "POST",
    "Access-Control-Request-Headers": "authorization, content-type",
}
BODY = {"model": "fake-model", "prompt": "hi", "max_tokens": 3, "temperature": 0}


@pytest.fixture(scope="module")
def server():
    with LiveServer(
        FakeEngine, api_key=(KEY,), allowed_origins=(APP, "http://localhost:3000")
    ) as live:
        yield live


def test_a_preflight_from_an_allowed_origin_is_answered_without_a_key(server):
    r = httpx.options(server.url + "/v1/completions", headers=PREFLIGHT)
    assert r.status_code in (200, 204)
    assert r.headers["access-control-allow-origin"] == APP
    assert "POST" in r.headers["access-control-allow-methods"]
    allowed = r.headers["access-control-allow-headers"].lower()
    assert "authorization" in allowed and "content-type" in allowed
    assert "access-control-allow-credentials" not in r.headers


def test_actual_requests_and_their_errors_carry_the_origin(server):
    auth = {"Authorization": f"Bearer {KEY}", "Origin": APP}
    ok = httpx.post(server.url + "/v1/completions", json=BODY, headers=auth)
    assert ok.status_code == 200 and ok.headers["access-control-allow-origin"] == APP
    ids = server.state.tokenizer.encode("hi", True)
    assert ok.json()["choices"][0]["text"] == expected_greedy_text(ids, 3)
    refused = httpx.post(server.url + "/v1/completions", json=BODY, headers={"Origin": APP})
    assert refused.status_code == 401 and refused.json()["error"]["code"] == "invalid_api_key"
    assert refused.headers["access-control-allow-origin"] == APP


def test_other_origins_get_no_cors_headers(server):
    evil = {**PREFLIGHT, "Origin": "https://evil.example"}
    r = httpx.options(server.url + "/v1/completions", headers=evil)
    assert r.status_code >= 400 and "access-control-allow-origin" not in r.headers
    auth = {"Authorization": f"Bearer {KEY}", "Origin": "https://evil.example"}
    ok = httpx.post(server.url + "/v1/completions", json=BODY, headers=auth)
    assert ok.status_code == 200 and "access-control-allow-origin" not in ok.headers


def test_without_allowed_origins_no_cors_header_is_sent():
    with LiveServer(FakeEngine) as live:
        r = httpx.options(live.url + "/v1/completions", headers=PREFLIGHT)
        assert "access-control-allow-origin" not in r.headers
        ok = httpx.post(live.url + "/v1/completions", json=BODY, headers={"Origin": APP})
        assert ok.status_code == 200 and "access-control-allow-origin" not in ok.headers


def test_a_wildcard_never_allows_credentials_and_503_carries_cors():
    with LiveServer(FakeEngine, allowed_origins=("*",)) as live:
        live.state.draining = True
        r = httpx.post(live.url + "/v1/completions", json=BODY, headers={"Origin": APP})
        assert r.status_code == 503 and r.headers["access-control-allow-origin"] == "*"
        assert "access-control-allow-credentials" not in r.headers
        live.state.draining = False


def test_allowed_origins_from_flags_and_environment():
    import argparse

    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    args = p.parse_args(
        ["--allowed-origins", "https://a.example/, http://b:8080", "--allowed-origins", "*"]
    )
    assert Settings.resolve(args, {}).allowed_origins == ("https://a.example", "http://b:8080", "*")
    env = {"TGSERVE_ALLOWED_ORIGINS": "https://a.example,https://c.example"}
    assert Settings.resolve(p.parse_args([]), env).allowed_origins == (
        "https://a.example",
        "https://c.example",
    )
    with pytest.raises(ValueError, match="TGSERVE_ALLOWED_ORIGINS"):
        Settings.resolve(p.parse_args([]), {"TGSERVE_ALLOWED_ORIGINS": "app.example/path"})
