"""/ready is 503 until the weights are loaded and a warm-up step ran; /health is a watchdog on
the engine loop (fails while work is pending and no step completes), not "process alive".
"""

from __future__ import annotations

import threading
import time

import httpx

from tests.server.fake_engine import BOS, FakeEngine, expected_greedy_text
from tests.server.live import LiveServer


def wait_for(predicate, timeout: float = 5.0) -> None:
    t0 = time.monotonic()
    while not predicate():
        assert time.monotonic() - t0 < timeout, "condition not reached in time"
        time.sleep(0.02)


def test_ready_waits_for_loading_and_warm_up_while_health_stays_up():
    release = threading.Event()
    engines: list[FakeEngine] = []

    def slow_factory() -> FakeEngine:
        release.wait(10)
        engines.append(FakeEngine())
        return engines[0]

    with LiveServer(slow_factory, wait_ready=False) as live:
        ready = httpx.get(live.url + "/ready")
        assert ready.status_code == 503 and ready.json()["status"] == "loading"
        assert httpx.get(live.url + "/health").status_code == 200
        refused = httpx.post(live.url + "/v1/completions", json={"prompt": "x"})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "not_ready"
        release.set()
        wait_for(lambda: httpx.get(live.url + "/ready").status_code == 200)
        assert engines[0].steps >= 1  # the warm-up request went through the engine first
        assert (
            httpx.post(
                live.url + "/v1/completions", json={"prompt": "x", "max_tokens": 1}
            ).status_code
            == 200
        )


def test_loading_wins_over_the_model_name_check_even_on_public_routes():
    release = threading.Event()

    def blocked_factory() -> FakeEngine:
        release.wait(10)
        return FakeEngine()

    public = ("/health", "/ready", "/metrics", "/v1/completions", "/tokenize")
    with LiveServer(blocked_factory, wait_ready=False, public_routes=public) as live:
        try:
            for body in ({"model": "fake-model", "prompt": "x"}, {"prompt": "x"}):
                refused = httpx.post(live.url + "/v1/completions", json=body)
                assert refused.status_code == 503, refused.text
                assert refused.json()["error"]["code"] == "not_ready"
                assert refused.headers["retry-after"] == "5"
            tokenize = httpx.post(
                live.url + "/tokenize", json={"model": "fake-model", "prompt": "x"}
            )
            assert tokenize.status_code == 503 and tokenize.headers["retry-after"] == "5"
            assert httpx.get(live.url + "/metrics").status_code == 200  # answered while loading
        finally:
            release.set()
        wait_for(lambda: httpx.get(live.url + "/ready").status_code == 200)
        body = {"model": "fake-model", "prompt": "x", "max_tokens": 2, "temperature": 0}
        served = httpx.post(live.url + "/v1/completions", json=body)
        assert served.json()["choices"][0]["text"] == expected_greedy_text([BOS, ord("x")], 2)


def test_health_fails_while_the_loop_is_stalled_with_work_pending_and_recovers():
    fake = FakeEngine(step_delay=0.01)
    with LiveServer(lambda: fake, health_stall_timeout=0.3) as live:
        time.sleep(0.5)
        assert httpx.get(live.url + "/health").status_code == 200  # idle is healthy
        fake.stall.set()
        with httpx.Client(base_url=live.url, timeout=20) as client:
            result: list[httpx.Response] = []
            worker = threading.Thread(
                target=lambda: result.append(
                    client.post("/v1/completions", json={"prompt": "x", "max_tokens": 3})
                )
            )
            worker.start()
            wait_for(lambda: httpx.get(live.url + "/health").status_code == 503)
            assert httpx.get(live.url + "/health").json() == {"status": "unhealthy"}
            fake.stall.clear()
            worker.join(10)
        assert result[0].status_code == 200
        wait_for(lambda: httpx.get(live.url + "/health").status_code == 200)


def test_a_failed_load_is_reported_and_never_turns_ready():
    def broken() -> FakeEngine:
        raise FileNotFoundError("no weights in /some/where")

    fatal = threading.Event()
    live = LiveServer(broken, wait_ready=False, on_fatal=fatal.set)
    with live:
        assert fatal.wait(5)
        assert httpx.get(live.url + "/ready").status_code == 503
