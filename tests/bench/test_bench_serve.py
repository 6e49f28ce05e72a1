"""`tgserve bench serve`: Poisson arrivals, percentiles, and the streaming load generator against a
fake OpenAI-compatible server whose delays are known (so TTFT, ITL and TPOT have an oracle)."""

from __future__ import annotations

import asyncio
import json
import math
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import numpy as np
import pytest

from bench.serve_load import LoadSpec, arrival_gaps, discover_vocab_size, run_load
from bench.serve_metrics import percentile, summarize, summarize_run
from bench.workload import BenchRequest
from server.cli import main


def _json_lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


SERVE_ARGS = "--num-requests 4 --concurrency 2 --input-len 6 --output-len 5 --vocab-size 7 --json"


def test_poisson_arrivals_are_seeded_with_the_requested_mean_rate():
    gaps = arrival_gaps(4001, request_rate=20.0, seed=1)
    assert gaps[0] == 0.0 and gaps == arrival_gaps(4001, 20.0, seed=1)
    assert abs(sum(gaps[1:]) / 4000 - 1 / 20) < 0.005  # mean gap 1 / rate (std error ~0.0008)
    assert arrival_gaps(3, math.inf, seed=1) == [0.0, 0.0, 0.0]


# ----- percentiles -------------------------------------------------------------------------------
def test_percentiles_match_hand_worked_values():
    values = [4.0, 1.0, 3.0, 2.0]  # sorted 1 2 3 4: rank = p/100 * 3
    assert percentile(values, 0) == 1.0
    assert percentile(values, 50) == pytest.approx(2.5)
    assert percentile(values, 90) == pytest.approx(3.7)
    assert percentile(values, 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    summary = summarize([0.001, 0.002, 0.003])  # seconds in, milliseconds out
    assert summary.mean_ms == pytest.approx(2.0) and summary.p50_ms == pytest.approx(2.0)
    assert summarize([]).p99_ms is None
    with pytest.raises(ValueError):
        percentile([], 50)


def test_percentiles_agree_with_numpy_on_random_data():
    rng = np.random.default_rng(0)
    for n in (2, 5, 17, 100):
        data = rng.exponential(size=n).tolist()
        for p in (1, 50, 90, 99):
            assert percentile(data, p) == pytest.approx(float(np.percentile(data, p)))


# ----- serving load against a fake streaming server ------------------------------------------------
@contextmanager
def fake_streaming_server(
    ttft: float, itl: float, fake: _FakeHandler | None = None
) -> Iterator[str]:
    """An OpenAI-style /v1/completions on raw asyncio streams, yielding its URL: the first token
    after `ttft` seconds, then one every `itl` seconds, a finish-only chunk, a usage chunk, [DONE].
    Prompts starting with token 7 get HTTP 503; starting with 8, a stream cut before [DONE];
    starting with 9, the text of every other token (the 1st, 3rd, ...) is held back and sent with
    the next token's (as a server does inside a UTF-8 character), unless logprobs were asked:
    then a chunk per token. /info states a vocabulary of 6; `fake` (optional) records prompts."""
    fake = fake or _FakeHandler(ttft, itl)
    loop = asyncio.new_event_loop()
    server = loop.run_until_complete(asyncio.start_server(fake.handle, "127.0.0.1", 0))
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}"
    finally:
        loop.call_soon_threadsafe(loop.stop)
        thread.join(5)


class _FakeHandler:
    def __init__(self, ttft: float, itl: float) -> None:
        self.ttft, self.itl = ttft, itl
        self.vocab_size = 6  # what /info states: ids 0-5, none of the special 7, 8, 9
        self.prompts: list[list[int]] = []

    async def handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        request_line = (await reader.readline()).decode()
        headers = {}
        while (line := await reader.readline()) not in (b"\r\n", b""):
            key, _, value = line.decode().partition(":")
            headers[key.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", 0)))
        path = request_line.split(" ")[1]
        if path in ("/v1/models", "/info"):
            listing = {"object": "list", "data": [{"id": "fake-model"}]}
            facts = {"model_id": "fake-model", "vocab_size": self.vocab_size}
            payload = json.dumps(listing if path == "/v1/models" else facts).encode()
            writer.write(_head("200 OK", f"Content-Length: {len(payload)}") + payload)
        else:
            self.prompts.append(json.loads(body)["prompt"])
            await self._complete(json.loads(body), writer)
        await writer.drain()
        writer.close()

    async def _complete(self, req: dict, writer: asyncio.StreamWriter) -> None:
        if req["prompt"][0] == 7:
            writer.write(_head("503 Service Unavailable", "Content-Length: 4") + b"busy")
            return
        writer.write(
            _head("200 OK", "Content-Type: text/event-stream\r\nTransfer-Encoding: chunked")
        )

        async def event(data: object) -> None:
            frame = f"data: {data if isinstance(data, str) else json.dumps(data)}\n\n".encode()
            writer.write(f"{len(frame):x}\r\n".encode() + frame + b"\r\n")
            await writer.drain()

        n = req["max_tokens"]
        held = ""
        for i in range(n):
            await asyncio.sleep(self.ttft if i == 0 else self.itl)
            text, scored = held + f" t{i}", "logprobs" in req
            if req["prompt"][0] == 9 and i % 2 == 0:
                held, text = text, ""
                if not scored:
                    continue
            held = "" if text else held
            choice = {"index": 0, "text": text, "finish_reason": None}
            if scored:
                choice["logprobs"] = {"tokens": [f" t{i}"], "token_logprobs": [-0.5]}
            await event({"choices": [choice]})
        if req["prompt"][0] != 8:  # 8: the stream is cut, no usage and no [DONE]
            await event({"choices": [{"index": 0, "text": "", "finish_reason": "length"}]})
            await event(
                {
                    "choices": [],
                    "usage": {"prompt_tokens": len(req["prompt"]), "completion_tokens": n},
                }
            )
            await event("[DONE]")
        writer.write(b"0\r\n\r\n")


def _head(status: str, headers: str) -> bytes:
    return f"HTTP/1.1 {status}\r\n{headers}\r\nConnection: close\r\n\r\n".encode()


def test_serve_measures_ttft_itl_and_tpot_from_known_delays(capsys):
    with fake_streaming_server(ttft=0.30, itl=0.10) as url:
        argv = ["bench", "serve", "--url", url, *SERVE_ARGS.split()]  # ids < 7: none fail
        assert main(argv) == 0
    (result,) = _json_lines(capsys)
    assert result["kind"] == "serve" and result["completed"] == 4 and result["failed"] == 0
    assert result["output_tokens"] == 4 * 5 and result["prompt_tokens"] == 4 * 6
    assert 300 <= result["ttft"]["p50_ms"] < 500  # a 0.3 s sleep; a loaded machine adds some
    assert 90 <= result["itl"]["p50_ms"] < 150 and 90 <= result["tpot"]["p50_ms"] < 150
    assert 700 <= result["e2e"]["p50_ms"] < 900  # 0.3 + 4 * 0.1
    assert 1.4 <= result["duration_s"] < 2.2  # two waves of two concurrent requests
    assert result["output_tok_s"] == pytest.approx(20 / result["duration_s"])


def test_serve_counts_failed_and_cut_streams_without_their_figures():
    requests = [BenchRequest((1, 2, 3), 3), BenchRequest((7, 2, 3), 3), BenchRequest((8, 2, 3), 3)]
    with fake_streaming_server(ttft=0.05, itl=0.02) as url:
        spec = LoadSpec(url, concurrency=3)
        records, duration = run_load(spec, requests, lambda _n: None)
    assert [r.ok for r in records] == [True, False, False]
    assert "503" in records[1].error and "[DONE]" in records[2].error
    # three token chunks; the finish-only chunk carries no token
    assert records[0].output_tokens == 3 and len(records[0].itl_s) == 2
    result = summarize_run(spec, records, duration, (0.0, 0.0, 0.0), (0.0, 0.0, 0.0))
    assert (result.completed, result.failed, result.output_tokens) == (1, 2, 3)
    assert len(result.errors) == 2


def test_tokens_held_back_inside_a_chunk_are_counted_and_timed_per_token_with_logprobs():
    """8 tokens 0.05 s apart, every other one's text held back: 4 chunks 0.1 s apart (3 gaps),
    4 tokens merged; asking for logprobs gives 7 gaps of 0.05 s and none merged."""
    requests = [BenchRequest((9, 2, 3), 8)]
    with fake_streaming_server(ttft=0.05, itl=0.05) as url:
        plain = LoadSpec(url, concurrency=1)
        [merged], duration = run_load(plain, requests, lambda _n: None)
        scored = LoadSpec(url, concurrency=1, token_logprobs=True)
        [timed], _ = run_load(scored, requests, lambda _n: None)
    assert merged.ok and merged.output_tokens == 8 and merged.chunks == 4
    assert len(merged.itl_s) == 3 and all(0.09 <= gap < 0.2 for gap in merged.itl_s)
    result = summarize_run(plain, [merged], duration, (0.0,) * 3, (0.0,) * 3)
    assert result.merged_tokens == 4
    assert timed.ok and timed.chunks == 8
    assert len(timed.itl_s) == 7 and all(0.04 <= gap < 0.1 for gap in timed.itl_s)
    assert summarize_run(scored, [timed], duration, (0.0,) * 3, (0.0,) * 3).merged_tokens == 0


def test_prompt_ids_are_drawn_below_the_vocabulary_the_server_states(capsys):
    """Without --vocab-size or --model the ids come from the server's /info (6 here), not from
    the 1000-id fallback, whose byte tokens make answers that end inside UTF-8 characters."""
    fake = _FakeHandler(ttft=0.01, itl=0.01)
    args = "--num-requests 8 --concurrency 4 --input-len 50 --output-len 2 --json"
    with fake_streaming_server(0.01, 0.01, fake) as url:
        assert main(["bench", "serve", "--url", url, *args.split()]) == 0
    (result,) = _json_lines(capsys)
    assert result["completed"] == 8
    ids = [t for prompt in fake.prompts for t in prompt]
    assert len(fake.prompts) == 8 and len(ids) == 8 * 50
    assert set(ids) == set(range(6))  # 400 draws: all six ids appear, none above


def test_a_server_that_states_no_vocabulary_leaves_the_fallback():
    fake = _FakeHandler(ttft=0.01, itl=0.01)
    fake.vocab_size = None
    with fake_streaming_server(0.01, 0.01, fake) as url:
        assert discover_vocab_size(url) is None
        fake.vocab_size = 6
        assert discover_vocab_size(url) == 6
