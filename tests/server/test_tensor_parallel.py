"""`tgserve serve --tensor-parallel-size 2` on gloo: the same greedy text as one process,
through the engine and through HTTP; a dead rank fails /health within 10 s, ends the open
stream with an error and makes the server exit non-zero; SIGTERM drains, then every rank's
process is gone (checked by pid)."""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from pathlib import Path

import httpx
import pytest

from engine import Engine, EngineConfig
from engine.requests.sampling_params import SamplingParams
from tests.server.live import free_port
from tests.server.test_shutdown import read_stream, start

PROMPTS = ["Hello world! How are", "The quick brown fox", "Numbers like 12345"]


def _config(tp: int) -> EngineConfig:
    return EngineConfig(
        dtype="float32",
        device="cpu",
        block_size=4,
        kv_cache_memory_bytes=4_000_000,
        max_num_seqs=8,
        tensor_parallel_size=tp,
    )


@pytest.fixture(scope="module")
def solo_texts(tiny_model_folder) -> list[str]:
    engine = Engine.from_model(str(tiny_model_folder), _config(1))
    outs = engine.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0.0))
    return [o.outputs[0].text for o in outs]


def _children(pid: int) -> list[int]:
    """Pids whose parent is `pid` (from /proc)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                stat = (entry / "stat").read_text()
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == pid:
                found.append(int(entry.name))
    return found


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def _serve(folder: Path, port: int):
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
        "--max-num-seqs",
        "8",
        "--shutdown-timeout",
        "10",
    ]
    process = start(args, port, env={"TGSERVE_TENSOR_PARALLEL_SIZE": "2"})
    ranks = _children(process.pid)
    assert len(ranks) == 1, ranks  # rank 1; rank 0 is the server's own process
    return process, ranks[0]


def test_engine_tp2_greedy_text_equals_one_process(tiny_model_folder, solo_texts) -> None:
    engine = Engine.from_model(str(tiny_model_folder), _config(2))
    try:
        assert engine.runner.parallel is not None and engine.runner.parallel.is_driver
        outs = engine.generate(PROMPTS, SamplingParams(max_tokens=24, temperature=0.0))
    finally:
        engine.close()
    assert [o.outputs[0].text for o in outs] == solo_texts
    assert all(not _alive(pid) for pid in engine.runner.parallel.workers.pids)


def test_http_tp2_same_text_then_sigterm_drains_and_stops_every_rank(
    tiny_model_folder, solo_texts
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process, rank1 = _serve(tiny_model_folder, port)
    try:
        for prompt, want in zip(PROMPTS, solo_texts, strict=True):
            body = {"prompt": prompt, "max_tokens": 24, "temperature": 0}
            got = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
            assert got["choices"][0]["text"] == want
        events: list[str] = []
        body = {"prompt": PROMPTS[0], "max_tokens": 24, "temperature": 0, "stream": True}
        reader = threading.Thread(target=read_stream, args=(url + "/v1/completions", body, events))
        reader.start()
        while not events:
            time.sleep(0.01)
        process.send_signal(signal.SIGTERM)
        reader.join(30)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert process.returncode == 0, output
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert events[-1] == "data: [DONE]" and text == solo_texts[0]  # drained, not cut
    deadline = time.monotonic() + 5
    while _alive(rank1) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not _alive(rank1), "rank 1 outlived the server"


def test_a_dead_rank_fails_health_ends_the_stream_with_an_error_and_exits_non_zero(
    tiny_model_folder,
) -> None:
    port = free_port()
    url = f"http://127.0.0.1:{port}"
    process, rank1 = _serve(tiny_model_folder, port)
    try:
        assert httpx.get(url + "/health").status_code == 200
        events: list[str] = []
        body = {
            "prompt": PROMPTS[1],
            "max_tokens": 230,  # the tiny model's context is 256
            "temperature": 0,
            "stream": True,
            "ignore_eos": True,
        }
        reader = threading.Thread(target=read_stream, args=(url + "/v1/completions", body, events))
        reader.start()
        deadline = time.monotonic() + 60
        while len(events) < 3 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(events) >= 3 and "error" not in events[0], events
        os.kill(rank1, signal.SIGKILL)
        t0 = time.monotonic()
        while time.monotonic() - t0 < 10:
            try:
                if httpx.get(url + "/health", timeout=2).status_code != 200:
                    break
            except httpx.TransportError:  # the server is gone already: health failed too
                break
            time.sleep(0.1)
        health_failed_after = time.monotonic() - t0
        reader.join(20)
        output, _ = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
    assert health_failed_after < 10
    assert process.returncode not in (0, None), output
    assert "rank" in output
    assert events[-1] == "data: [DONE]", events[-3:]
    assert json.loads(events[-2][6:])["error"]["code"] == "engine_error"
