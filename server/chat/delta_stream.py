"""One engine stream read as chat deltas: the loop the Anthropic and Responses event writers share.

Contract: `message_deltas(stream, reader)` reads the engine's outputs of a one-choice request
and yields, per output, a `DeltaBatch`: the choice's output so far (`out`: its finish reason and
token count) and the chat deltas (server/chat/output.py) that its new text made, with
`reader.finish`'s deltas appended once the output ended. A failed or aborted request yields one
batch with `failed` set (`error`: the engine's text, None for an abort) and no deltas, and ends.
The engine stream is closed when the caller stops early (the engine request is aborted then):
callers wrap the generator in `aclosing` so that happens at once, not when it is collected.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import aclosing
from dataclasses import dataclass, field

from engine import CompletionOutput, RequestOutput
from server.chat.output import Delta, MessageStream


@dataclass(frozen=True)
class DeltaBatch:
    out: CompletionOutput
    deltas: list[Delta] = field(default_factory=list)
    failed: bool = False
    error: str | None = None  # the engine's error text when failed; None for an abort

    @property
    def finished(self) -> bool:
        return self.out.finish_reason is not None


async def message_deltas(
    stream: AsyncIterator[RequestOutput], reader: MessageStream
) -> AsyncIterator[DeltaBatch]:
    chars = tokens = 0
    async with aclosing(stream) as outputs:
        async for output in outputs:
            out = output.outputs[0]
            new = out.unseen(chars, tokens)  # the text since the last output
            chars, tokens = out.text_end, out.num_tokens
            if output.error is not None or out.finish_reason == "abort":
                yield DeltaBatch(out, failed=True, error=output.error)
                return
            deltas = reader.feed(new.text) if new.text else []
            if out.finish_reason is not None:
                deltas += reader.finish(out.finish_reason)
            yield DeltaBatch(out, deltas)
