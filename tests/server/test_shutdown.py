"""Graceful shutdown of a real server process: on SIGTERM / SIGINT /ready turns 503, new
requests get 503, in-flight requests that fit in --shutdown-timeout finish normally, streams
still open after it end with a final `finish_reason: "abort"` chunk and `[DONE]`, exit code 0.
The CLI path (`tgserve serve` with flags and TGSERVE_* variables) is exercised the same way.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests.server.fake_engine import BOS, expected_greedy_text
from tests.server.live import free_port, metric

ROOT = Path(__file__).resolve().parents[2]


def start(
    args: list[str], port: int, env: dict[str, str] | None = None, headers=None
) -> subprocess.Popen:
    process = subprocess.Popen(
        [sys.executable, *args],
        cwd=ROOT,
        env={**os.environ, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    deadline = time.monotonic() + 240  # a cold build of the C++ kernels takes ~1 min
    while True:
        assert process.poll() is None, process.stdout.read()
        assert time.monotonic() < deadline, "the server did not become ready"
        try:
            if httpx.get(f"http://127.0.0.1:{port}/ready", headers=headers).status_code == 200:
                return process
        except httpx.TransportError:
            pass
        time.sleep(0.1)


def stop(process: subprocess.Popen, sig: signal.Signals, timeout: float = 20) -> tuple[int, str]:
    process.send_signal(sig)
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        raise
    return process.returncode, output


def read_stream(url: str, body: dict, sink: list) -> None:
    with httpx.stream("POST", url, json=body, timeout=60) as response:
        for line in response.iter_lines():
            if line:
                sink.append(line)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_drains_then_aborts_open_streams_and_exits_zero(sig):
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start(["-m", "tests.server.fake_server_main", str(port), "1.0", "0.01"], port)
    try:
        events: list[str] = []
        long_body = {"prompt": "long", "max_tokens": 3000, "temperature": 0, "stream": True}
        reader = threading.Thread(
            target=read_stream, args=(url + "/v1/completions", long_body, events)
        )
        reader.start()
        short: list[httpx.Response] = []
        short_body = {"prompt": "short", "max_tokens": 40, "temperature": 0}
        asker = threading.Thread(
            target=lambda: short.append(
                httpx.post(url + "/v1/completions", json=short_body, timeout=60)
            )
        )
        while len(events) < 3:
            time.sleep(0.01)
        asker.start()
        while metric(httpx.get(url + "/metrics").text, "tgserve_num_requests_running") < 2:
            time.sleep(0.005)
        process.send_signal(sig)
        time.sleep(0.2)
        assert httpx.get(url + "/ready").status_code == 503  # draining
        refused = httpx.post(url + "/v1/completions", json=short_body)
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        assert refused.headers["retry-after"] == "5"
        reader.join(20)
        asker.join(20)
        output, _ = process.communicate(timeout=20)
        code = process.returncode
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0, output
    assert short[0].status_code == 200  # finished inside the shutdown timeout
    assert short[0].json()["choices"][0]["text"] == expected_greedy_text([BOS, *b"short"], 40)
    assert events[-1] == "data: [DONE]"
    finishes = [json.loads(e[6:])["choices"][0]["finish_reason"] for e in events[:-1]]
    assert finishes[-1] == "abort" and finishes.count("abort") == 1 and set(finishes[:-1]) == {None}
    assert "draining" in output


def test_shutdown_timeout_zero_aborts_in_flight_streams_at_once_and_exits_zero():
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process = start(["-m", "tests.server.fake_server_main", str(port), "0", "0.01"], port)
    try:
        events: list[str] = []
        body = {"prompt": "long", "max_tokens": 3000, "temperature": 0, "stream": True}
        reader = threading.Thread(target=read_stream, args=(url + "/v1/completions", body, events))
        reader.start()
        while len(events) < 3:
            time.sleep(0.01)
        t0 = time.monotonic()
        process.send_signal(signal.SIGTERM)
        reader.join(20)
        aborted_after = time.monotonic() - t0
        output, _ = process.communicate(timeout=20)
        code = process.returncode
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0, output
    assert aborted_after < 3  # 3000 tokens at 10ms a step would take 30s
    assert events[-1] == "data: [DONE]"
    chunks = [json.loads(e[6:]) for e in events[:-1]]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert 0 < len(text) < 3000
    assert text == expected_greedy_text([BOS, *b"long"], len(text))
    finishes = [c["choices"][0]["finish_reason"] for c in chunks]
    assert finishes[-1] == "abort" and finishes.count("abort") == 1


def test_cli_serve_reads_flags_and_environment_and_stops_cleanly_on_sigterm(tiny_model_folder):
    folder = tiny_model_folder
    port = free_port()
    key = "cli-secret-key"
    auth = {"Authorization": f"Bearer {key}"}
    env = {
        "TGSERVE_API_KEY": key,
        "TGSERVE_MAX_MODEL_LEN": "64",
        "TGSERVE_PORT": "1",
    }  # flag wins over env
    args = [
        "-m",
        "server.cli",
        "serve",
        "--model",
        str(folder),
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--kv-cache-memory",
        "4MB",
        "--block-size",
        "4",
        "--dtype",
        "float32",
        "--served-model-name",
        "tiny-llama",
    ]
    process = start(args, port, env=env, headers=auth)
    try:
        url = f"http://127.0.0.1:{port}"
        assert httpx.get(url + "/v1/models").status_code == 401
        models = httpx.get(url + "/v1/models", headers=auth).json()["data"]
        assert [(m["id"], m["max_model_len"]) for m in models] == [("tiny-llama", 64)]
        body = {"model": "tiny-llama", "prompt": "Hello", "max_tokens": 3, "temperature": 0}
        assert httpx.post(url + "/v1/completions", json=body, headers=auth).status_code == 200
        code, output = stop(process, signal.SIGTERM)
    finally:
        if process.poll() is None:
            process.kill()
    assert code == 0, output
    assert "KV cache" in output and f"listening on http://127.0.0.1:{port}" in output
    assert key not in output
