"""Lifecycle of a real server process (serve_engine on the fake engine, tests/server/fake_server_main):
streams in flight when SIGTERM comes finish whole and the exit code is 0; a second signal
during the drain cuts everything and exits at once with 128 + the signal number; an engine
loop killed by an injected fault fails /health and /ready, ends in-flight streams with error
events and exits non-zero so an orchestrator restarts the server.
"""

from __future__ import annotations

import json
import signal
import subprocess
import threading
import time

import httpx

from tests.server.fake_engine import BOS, expected_greedy_text
from tests.server.live import free_port
from tests.server.test_shutdown import read_stream, start


def serve(shutdown_timeout: str, *flags: str) -> tuple[subprocess.Popen, str]:
    port = free_port()
    args = ["-m", "tests.server.fake_server_main", str(port), shutdown_timeout, "0.01", *flags]
    return start(args, port), f"http://127.0.0.1:{port}"


def stream_in_thread(url: str, body: dict) -> tuple[threading.Thread, list[str]]:
    events: list[str] = []

    def read() -> None:
        try:
            read_stream(url + "/v1/completions", body, events)
        except httpx.TransportError:  # cut by a forced exit: `events` shows what came
            events.append("<cut>")

    reader = threading.Thread(target=read)
    reader.start()
    return reader, events


def wait_until(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def texts(events: list[str]) -> str:
    return "".join(json.loads(e[6:])["choices"][0]["text"] for e in events if e[6:7] == "{")


def test_sigterm_lets_streams_in_flight_finish_whole_then_exits_zero():
    process, url = serve("30")
    try:
        bodies = [
            {"prompt": p, "max_tokens": 80, "temperature": 0, "stream": True} for p in ("a", "b")
        ]
        readers = [stream_in_thread(url, body) for body in bodies]
        wait_until(lambda: all(len(events) >= 3 for _, events in readers))
        process.send_signal(signal.SIGTERM)
        for reader, _ in readers:
            reader.join(30)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    for (_, events), prompt in zip(readers, "ab", strict=True):
        assert events[-1] == "data: [DONE]"
        assert json.loads(events[-2][6:])["choices"][0]["finish_reason"] == "length"
        assert texts(events) == expected_greedy_text([BOS, *prompt.encode()], 80)


def test_a_second_signal_during_the_drain_exits_at_once_with_128_plus_the_signal():
    process, url = serve("60")
    try:
        reader, events = stream_in_thread(
            url, {"prompt": "long", "max_tokens": 3000, "temperature": 0, "stream": True}
        )
        wait_until(lambda: len(events) >= 3)
        process.send_signal(signal.SIGTERM)
        wait_until(lambda: httpx.get(url + "/ready").status_code == 503)  # draining
        t0 = time.monotonic()
        process.send_signal(signal.SIGINT)
        output, _ = process.communicate(timeout=10)
        exited_after = time.monotonic() - t0
        reader.join(10)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + signal.SIGINT, output
    assert exited_after < 5  # the stream alone had 30s of work left, the drain 60s
    assert "SIGINT again: exiting now" in output
    assert events[-1] == "<cut>"  # cut, not finished


def test_a_killed_engine_loop_fails_health_ends_streams_with_errors_and_exits_non_zero():
    process, url = serve("30", "--enable-fault-injection")
    try:
        body = {"prompt": "by", "max_tokens": 3000, "temperature": 0, "stream": True}
        bystander, by_events = stream_in_thread(url, body)
        wait_until(lambda: len(by_events) >= 3)
        killer, kill_events = stream_in_thread(
            url, {**body, "prompt": "kill", "fault": {"kill_engine_after_tokens": 2}}
        )
        t0 = time.monotonic()
        killer.join(10)
        bystander.join(10)

        def probe_fails(route: str) -> bool:
            try:
                return httpx.get(url + route).status_code != 200
            except httpx.TransportError:  # the process is already gone: down as well
                return True

        wait_until(lambda: probe_fails("/health") and probe_fails("/ready"), timeout=10)
        assert time.monotonic() - t0 < 10
        output, _ = process.communicate(timeout=20)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 1, output
    assert "fault injection is ON" in output and "the engine loop died" in output
    for events in (kill_events, by_events):
        assert events[-1] == "data: [DONE]"
        error = json.loads(events[-2][6:])["error"]
        assert error["code"] == "engine_error" and "FatalEngineError" in error["message"]
