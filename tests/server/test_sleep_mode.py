"""Sleep mode over HTTP (server/sleep.py, --enable-sleep-mode): level 1 frees the KV pool and
level 2 drops the engine (weights too, rebuilt from the model source at wake-up); requests meet
a 503 naming the state while asleep; wake-up restores the same answers; an idle timeout sleeps
on its own and the next request wakes it.

Oracles: the answer of the same greedy request before sleeping; the pool's storage bytes; the
number of engines the factory built; a weak reference to the dropped engine.
"""

from __future__ import annotations

import gc
import time
import weakref

import httpx
import pytest

from engine import Engine, EngineConfig
from tests.server.live import LiveServer
from tests.server.tiny_model import make_tiny_model

BODY = {"prompt": [5, 9, 14, 3, 77, 20, 8], "max_tokens": 8, "temperature": 0.0}


def _complete(url: str) -> httpx.Response:
    return httpx.post(url + "/v1/completions", json=BODY, timeout=60)


def _pool_bytes(engine: Engine) -> int:
    return sum(t.untyped_storage().nbytes() for pair in engine.runner.kv_caches for t in pair)


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return make_tiny_model(tmp_path_factory.mktemp("sleep") / "tiny")


def _server(folder, built: list, **settings) -> LiveServer:
    config = EngineConfig(dtype="float32", kv_cache_memory_bytes=2_000_000, block_size=4)

    def build() -> Engine:
        engine = Engine.from_model(str(folder), config)
        built.append(weakref.ref(engine))
        return engine

    return LiveServer(build, enable_sleep_mode=True, **settings)


def test_sleep_levels_free_memory_refuse_requests_and_wake_to_the_same_answers(folder) -> None:
    """Also: refused while a request runs (409) and for an unknown level (400)."""
    built: list = []
    with _server(folder, built) as live:
        answer = _complete(live.url).json()["choices"][0]["text"]
        bad = httpx.post(live.url + "/sleep", params={"level": 3})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "level"
        body = {**BODY, "max_tokens": 200, "ignore_eos": True, "stream": True}
        with httpx.stream("POST", live.url + "/v1/completions", json=body, timeout=60) as stream:
            lines = stream.iter_lines()
            next(lines)  # the request is running
            busy = httpx.post(live.url + "/sleep")
            assert busy.status_code == 409 and busy.json()["error"]["code"] == "busy"
            for _ in lines:
                pass
        assert httpx.get(live.url + "/is_sleeping").json()["is_sleeping"] is False
        engine = built[0]()
        pool = _pool_bytes(engine)
        assert pool > 0
        r = httpx.post(live.url + "/sleep", params={"level": 1})
        assert r.status_code == 200 and r.json() == {"is_sleeping": True, "level": 1}
        assert httpx.get(live.url + "/is_sleeping").json() == {"is_sleeping": True, "level": 1}
        assert _pool_bytes(engine) == 0
        refused = _complete(live.url)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "sleeping"
        assert "/wake_up" in refused.json()["error"]["message"]
        ready = httpx.get(live.url + "/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "sleeping"
        assert httpx.get(live.url + "/health").status_code == 200
        assert httpx.post(live.url + "/wake_up").json() == {"is_sleeping": False, "level": 0}
        assert _pool_bytes(engine) == pool and len(built) == 1  # the same engine, its pool back
        assert _complete(live.url).json()["choices"][0]["text"] == answer
        del engine
        assert httpx.post(live.url + "/sleep", params={"level": 2}).status_code == 200
        gc.collect()
        assert built[0]() is None  # the engine (weights and pool) is gone
        assert httpx.post(live.url + "/wake_up").status_code == 200
        assert len(built) == 2  # built again from the model folder
        assert _complete(live.url).json()["choices"][0]["text"] == answer
        assert httpx.get(live.url + "/ready").status_code == 200


def test_idle_timeout_sleeps_and_the_next_request_wakes_it(folder) -> None:
    built: list = []
    with _server(folder, built, sleep_idle_timeout=0.5) as live:
        answer = _complete(live.url).json()["choices"][0]["text"]
        deadline = time.monotonic() + 20
        while not httpx.get(live.url + "/is_sleeping").json()["is_sleeping"]:
            assert time.monotonic() < deadline, "the idle server never slept"
            time.sleep(0.1)
        assert _pool_bytes(built[0]()) == 0
        first = _complete(live.url)
        assert first.status_code == 503 and "waking up" in first.json()["error"]["message"]
        while (r := _complete(live.url)).status_code == 503:
            assert time.monotonic() < deadline + 20, "the server never woke up"
            time.sleep(0.1)
        assert r.json()["choices"][0]["text"] == answer


def test_sleep_routes_are_absent_without_the_flag(folder) -> None:
    config = EngineConfig(dtype="float32", kv_cache_memory_bytes=2_000_000, block_size=4)
    with LiveServer(lambda: Engine.from_model(str(folder), config)) as live:
        assert httpx.post(live.url + "/sleep").status_code == 404
        assert httpx.get(live.url + "/is_sleeping").status_code == 404
