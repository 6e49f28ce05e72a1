"""Reasoning output: `<think>...</think>` split from the answer into `reasoning_content`.

Contract: `ReasoningParser(starts_inside)` reads a model output in which the reasoning opens
with `<think>` (after leading whitespace), or, when `starts_inside` (the prompt already ended
with `<think>`, as templates that force thinking do, or the model writes no opening tag: Qwen3,
DeepSeek-R1 with `--reasoning-parser think_inside`), from the first character (a `<think>` the
output opens with anyway is dropped). The reasoning
runs to `</think>`; without it (a truncated output) everything after the open is reasoning.
`parse(text)` returns (reasoning or None when the output has none, content); `stream()` reads
the same text in any split and its `feed` / `finish` return ("reasoning" | "content", text)
pieces that concatenate per kind to exactly `parse`'s result. Whitespace around the reasoning
and between `</think>` and the answer is neither's. `uses_reasoning(template)` says whether a
chat template teaches `<think>` (the default of `--reasoning-parser auto`).
"""

from __future__ import annotations

from server.chat.tool_calls.holdback import WHITESPACE, BufferedReader, TextUntilTag

OPEN, CLOSE = "<think>", "</think>"
Piece = tuple[str, str]


def uses_reasoning(template: str | None) -> bool:
    return bool(template) and OPEN in template and CLOSE in template


def prompt_opens_reasoning(prompt: str) -> bool:
    """The generation prompt ends inside a think block: the output starts with reasoning."""
    return prompt.rstrip(WHITESPACE).endswith(OPEN)


class ReasoningParser:
    def __init__(self, starts_inside: bool = False) -> None:
        self.starts_inside = starts_inside

    def parse(self, text: str) -> tuple[str | None, str]:
        body = text
        head = text.lstrip(WHITESPACE)
        if head.startswith(OPEN):  # opened here (also when it already was: a repeated tag)
            body = head[len(OPEN) :]
        elif not self.starts_inside:
            return None, text
        end = body.find(CLOSE)
        if end < 0:
            return body.lstrip(WHITESPACE), ""
        return body[:end].strip(WHITESPACE), body[end + len(CLOSE) :].lstrip(WHITESPACE)

    def stream(self) -> ReasoningStream:
        return ReasoningStream(self.starts_inside)


class ReasoningStream(BufferedReader):
    def __init__(self, starts_inside: bool) -> None:
        super().__init__()
        self._inside = starts_inside
        self._mode = "lead"  # lead | reasoning | answer
        self._reasoning = TextUntilTag(CLOSE)
        self._reasoning.after_call = True  # whitespace after <think> is not reasoning
        self._strip_answer = True

    def _read(self, final: bool) -> list[Piece]:
        pieces: list[Piece] = []
        if self._mode == "lead":
            head = self._buf.lstrip(WHITESPACE)
            if not final and (not head or (OPEN.startswith(head) and head != OPEN)):
                return pieces  # may still open a think block
            if head.startswith(OPEN):
                self._mode, self._buf = "reasoning", head[len(OPEN) :]
            elif self._inside:
                self._mode = "reasoning"
            else:
                self._mode, self._strip_answer = "answer", False
        if self._mode == "reasoning":
            text, closed, self._buf = self._reasoning.read(self._buf, final)
            if text:
                pieces.append(("reasoning", text))
            if closed is None:
                return pieces
            self._mode = "answer"
        if self._strip_answer:
            self._buf = self._buf.lstrip(WHITESPACE)
            self._strip_answer = not self._buf
        if self._buf:
            pieces.append(("content", self._buf))
            self._buf = ""
        return pieces
