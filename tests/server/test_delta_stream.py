"""server/chat/delta_stream.py: the engine stream read as chat deltas, checked on hand-made
outputs (a plain format: every delta is `{"content": text}`)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import aclosing

from engine import CompletionOutput, RequestOutput
from server.chat.delta_stream import DeltaBatch, message_deltas
from server.chat.output import ChatOutputFormat


def _output(
    text: str,
    text_offset: int,
    ids: tuple[int, ...],
    token_offset: int,
    finish_reason: str | None = None,
    error: str | None = None,
) -> RequestOutput:
    out = CompletionOutput(
        0,
        text,
        ids,
        finish_reason=finish_reason,
        text_offset=text_offset,
        token_offset=token_offset,
    )
    done = finish_reason is not None
    return RequestOutput("r", (1, 2), (out,), done, error=error)


class _Engine:
    """An engine stream that records whether its reader closed it."""

    def __init__(self, outputs: list[RequestOutput]) -> None:
        self.outputs, self.closed, self.sent = outputs, False, 0
        self.closed_on_return = False

    async def stream(self) -> AsyncIterator[RequestOutput]:
        try:
            for output in self.outputs:
                self.sent += 1
                yield output
        finally:
            self.closed = True


def _read(engine: _Engine, stop_after: int | None = None) -> list[DeltaBatch]:
    async def run() -> list[DeltaBatch]:
        batches: list[DeltaBatch] = []
        reader = ChatOutputFormat().stream()
        async with aclosing(message_deltas(engine.stream(), reader)) as it:
            async for batch in it:
                batches.append(batch)
                if stop_after is not None and len(batches) == stop_after:
                    break
        # read before asyncio.run's shutdown closes leftover generators on its own
        engine.closed_on_return = engine.closed
        return batches

    return asyncio.run(run())


def _text(batches: list[DeltaBatch]) -> str:
    return "".join(d.get("content") or "" for b in batches for d in b.deltas)


def test_deltas_rebuild_the_text_once_even_when_an_output_restarts_from_zero() -> None:
    engine = _Engine(
        [
            _output("Hel", 0, (5,), 0),
            _output("lo", 3, (6,), 1),
            # a finished output that restarts the index from offset 0 (best_of / beam style):
            # only what the reader lacks (" you") may be sent again
            _output("Hello you", 0, (5, 6, 7), 0, finish_reason="stop"),
        ]
    )
    batches = _read(engine)
    assert _text(batches) == "Hello you"
    assert [b.finished for b in batches] == [False, False, True]
    assert batches[-1].out.num_tokens == 3 and not any(b.failed for b in batches)
    assert engine.closed_on_return


def test_a_failed_request_yields_one_failed_batch_and_ends() -> None:
    engine = _Engine(
        [
            _output("a", 0, (5,), 0),
            _output("", 1, (), 1, finish_reason="error", error="boom"),
            _output("never", 1, (9,), 1),
        ]
    )
    batches = _read(engine)
    assert [b.failed for b in batches] == [False, True]
    assert batches[1].error == "boom" and batches[1].deltas == []
    assert engine.closed_on_return and engine.sent == 2


def test_an_abort_fails_without_engine_text() -> None:
    batches = _read(_Engine([_output("", 0, (), 0, finish_reason="abort")]))
    assert len(batches) == 1 and batches[0].failed and batches[0].error is None


def test_a_reader_that_stops_early_closes_the_engine_stream_at_once() -> None:
    engine = _Engine([_output("a", 0, (5,), 0), _output("b", 1, (6,), 1)] * 3)
    batches = _read(engine, stop_after=1)
    assert len(batches) == 1 and engine.closed and engine.sent == 1
