"""Signals end `tgserve serve` promptly and cleanly: a SIGTERM while the model loads (a thread
inside torch's native code) exits 0, and a second SIGTERM / SIGINT during a drain exits
128 + the signal at once; never an abort ("terminate called without an active exception",
SIGABRT) and never a traceback in the log.

Oracle: the real process's exit code and output (as an orchestrator sees them).
"""

from __future__ import annotations

import contextlib
import signal
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.server.live import free_port
from tests.server.test_shutdown import ROOT, read_stream, start

PROMPTLY_S = 5.0  # a generous bound: the exit itself takes well under a second


def _clean(output: str) -> None:
    assert "terminate called" not in output, output[-2000:]
    assert "Traceback" not in output and "CancelledError" not in output, output[-2000:]


def test_sigterm_while_the_model_loads_exits_zero_without_an_abort():
    port = free_port()
    process = subprocess.Popen(
        [sys.executable, "-m", "tests.server.native_load_main", str(port)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        deadline = time.monotonic() + 120
        while True:
            assert process.poll() is None and time.monotonic() < deadline
            try:
                if httpx.get(f"http://127.0.0.1:{port}/health").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.1)
        assert httpx.get(f"http://127.0.0.1:{port}/ready").status_code == 503  # still loading
        time.sleep(0.5)
        t0 = time.monotonic()
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output[-2000:]
    assert took < PROMPTLY_S
    _clean(output)


@pytest.mark.parametrize("second", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_second_signal_during_the_drain_exits_at_once(second):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start(["-m", "tests.server.fake_server_main", str(port), "30", "0.01"], port)
    try:
        sinks: list[list[str]] = [[] for _ in range(6)]
        body = {"prompt": "long", "max_tokens": 3000, "temperature": 0, "stream": True}
        readers = [
            threading.Thread(
                target=_read_quietly, args=(url + "/v1/completions", body, sink), daemon=True
            )
            for sink in sinks
        ]
        for reader in readers:
            reader.start()
        while not all(len(sink) >= 3 for sink in sinks):
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        assert process.poll() is None  # draining: the streams have 30 s
        t0 = time.monotonic()
        process.send_signal(second)
        output, _ = process.communicate(timeout=30)
        took = time.monotonic() - t0
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 128 + int(second), output[-2000:]
    assert took < PROMPTLY_S
    assert f"{second.name} again: exiting now" in output
    _clean(output)


def _read_quietly(url: str, body: dict, sink: list[str]) -> None:
    with contextlib.suppress(httpx.HTTPError):  # cut by the forced exit
        read_stream(url, body, sink)
