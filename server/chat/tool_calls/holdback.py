"""Text a streaming parser must not show yet: a tag's possible start, whitespace before a call.

Contract: `partial_tag(text, tags)` is the length of the longest suffix of `text` that is a
proper prefix of one of `tags` (it may still grow into the tag). `held_tail(text, tags)` adds
the whitespace just before that suffix: whitespace next to a tool call is not content, so it is
shown only once text that is not a call follows it. Both are O(len(tag)^2) per call, independent
of the text before the tail. `BufferedReader` is the shape of a streaming reader: `feed(text)`
appends to its buffer and returns what `_read(final=False)` can tell; `finish()` reads the rest.
"""

from __future__ import annotations

from typing import Any

WHITESPACE = " \t\r\n"


class BufferedReader:
    def __init__(self) -> None:
        self._buf = ""

    def feed(self, text: str) -> list[Any]:
        self._buf += text
        return self._read(final=False)

    def finish(self) -> list[Any]:
        return self._read(final=True)

    def _read(self, final: bool) -> list[Any]:
        raise NotImplementedError


def partial_tag(text: str, tags: tuple[str, ...]) -> int:
    best = 0
    for tag in tags:
        for size in range(min(len(tag) - 1, len(text)), best, -1):
            if text.endswith(tag[:size]):
                best = size
                break
    return best


def held_tail(text: str, tags: tuple[str, ...]) -> int:
    keep = partial_tag(text, tags)
    while keep < len(text) and text[len(text) - keep - 1] in WHITESPACE:
        keep += 1
    return keep


class TextUntilTag:
    """The text part of a stream: content up to `tag`, held back while the tail may become it.

    `read(buf, final)` returns (content to show, whitespace just before the tag or None when
    the tag is not in `buf`, rest): rest is what follows the tag, or the held tail. After a call
    (`after_call`), leading whitespace is dropped until other text comes.
    """

    def __init__(self, tag: str) -> None:
        self.tag = tag
        self.after_call = False

    def read(self, buf: str, final: bool) -> tuple[str, str | None, str]:
        if self.after_call:
            stripped = buf.lstrip(WHITESPACE)
            if not stripped:
                return "", None, ""
            buf, self.after_call = stripped, False
        start = buf.find(self.tag)
        if start >= 0:
            before = buf[:start]
            text = before.rstrip(WHITESPACE)
            return text, before[len(text) :], buf[start + len(self.tag) :]
        keep = 0 if final else held_tail(buf, (self.tag,))
        return buf[: len(buf) - keep], None, buf[len(buf) - keep :]
