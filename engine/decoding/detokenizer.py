"""Incremental, byte-exact detokenization with stop strings, one instance per sequence.

Contract: feed each generated token with `add(token_id)`; `text` is the cumulative text that
may be shown so far and only ever grows (nothing is retracted); `finish()` returns the final
text, and `text` equals it afterwards. Guarantees:
- Bytes are decoded with Python's incremental UTF-8 decoder (`errors="replace"`): a character
  is released only once all its bytes are in, and byte sequences that can never complete
  become U+FFFD exactly as `bytes.decode(errors="replace")` of the whole output would.
  `finish()` drops the bytes of an incomplete trailing character (max_tokens, a stop token or
  an abort ended the output inside it): the text ends at the last complete character, as
  vLLM's does, never in a U+FFFD the model did not write, and the streamed deltas still add up
  to the final text (nothing is retracted: those bytes were never shown).
- Stop strings are matched on the decoded text, across token boundaries. The first stop to
  complete ends the text: it is cut at the start of that occurrence (after it with
  `include_stop_str_in_output`), `stop_string` names it and later `add` calls are refused.
  When several stops complete on the same character the longest (earliest-starting) wins.
- Stop strings are armed only from token `min_tokens + 1` on: an occurrence completed by an
  earlier token is ordinary text (the rule EOS and stop_token_ids follow in the sampler).
- Any tail of the text that could still grow into a stop string is held back until it
  cannot; `finish()` releases it.
- With `skip_special_tokens`, special tokens add no text (they still count for min_tokens).
- With `strip_first_space` (an output that starts without context, as an encoder-decoder's
  does, on a tokenizer whose `decode` drops the first piece's space: SentencePiece), the one
  space the first text-bearing token opens with is dropped, as `tokenizer.decode` of the whole
  output does.
Per-token cost is O(token bytes * number of stop strings), independent of the text so far:
each stop string runs a Knuth-Morris-Pratt automaton over the characters.
"""

from __future__ import annotations

import codecs
from typing import Protocol

from engine.requests.sampling_params import SamplingParams


class TokenBytes(Protocol):
    """What the detokenizer needs of a tokenizer (models/tokenizer.Tokenizer has both)."""

    def token_bytes(self, token_id: int) -> bytes: ...

    def is_special(self, token_id: int) -> bool: ...


class StopStringMatcher:
    """Tracks, for each stop string, the longest prefix of it that ends the text fed so far."""

    def __init__(self, stops: tuple[str, ...]) -> None:
        if any(not s for s in stops):
            raise ValueError("stop strings must be non-empty")
        self._stops = stops
        self._borders = [_border_table(s) for s in stops]
        self._state = [0] * len(stops)  # matched prefix length per stop string

    def feed(self, ch: str) -> str | None:
        """Advances by one character; returns the longest stop string completed by it."""
        hit: str | None = None
        for i, stop in enumerate(self._stops):
            q = self._state[i]
            while q > 0 and stop[q] != ch:
                q = self._borders[i][q - 1]
            if stop[q] == ch:
                q += 1
            if q == len(stop):
                if hit is None or len(stop) > len(hit):
                    hit = stop
                q = self._borders[i][q - 1]  # keep matching overlapping occurrences
            self._state[i] = q
        return hit

    @property
    def held(self) -> int:
        """Characters at the end of the text that may still start a stop string."""
        return max(self._state, default=0)


def _border_table(s: str) -> list[int]:
    """border[i] = length of the longest proper prefix of s[: i + 1] that is also its suffix."""
    border = [0] * len(s)
    k = 0
    for i in range(1, len(s)):
        while k > 0 and s[i] != s[k]:
            k = border[k - 1]
        if s[i] == s[k]:
            k += 1
        border[i] = k
    return border


class IncrementalDetokenizer:
    def __init__(
        self,
        tokenizer: TokenBytes,
        *,
        stop: tuple[str, ...] = (),
        include_stop_str_in_output: bool = False,
        skip_special_tokens: bool = True,
        min_tokens: int = 0,
        strip_first_space: bool = False,
    ) -> None:
        if min_tokens < 0:
            raise ValueError(f"min_tokens must be >= 0, got {min_tokens}")
        self._tokenizer = tokenizer
        self._include_stop = include_stop_str_in_output
        self._skip_special = skip_special_tokens
        self._min_tokens = min_tokens
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._matcher = StopStringMatcher(tuple(stop)) if stop else None
        self._pieces: list[str] = []  # emitted text, joined lazily by `text`
        self._num_taken = 0  # pieces already handed out by `take_new_text`
        self._held = ""  # decoded text not yet emitted: a possible start of a stop string
        self._num_tokens = 0
        self._done = False
        self._strip_pending = strip_first_space  # until the first text-bearing token
        self.stop_string: str | None = None  # the stop string that ended the text, if any

    @classmethod
    def from_params(
        cls, tokenizer: TokenBytes, params: SamplingParams, *, without_context: bool = False
    ) -> IncrementalDetokenizer:
        """`without_context`: the output is not a continuation of text (an encoder-decoder's)."""
        return cls(
            tokenizer,
            stop=params.stop,
            include_stop_str_in_output=params.include_stop_str_in_output,
            skip_special_tokens=params.skip_special_tokens,
            min_tokens=params.min_tokens,
            strip_first_space=without_context and getattr(tokenizer, "strips_first_space", False),
        )

    @property
    def text(self) -> str:
        """All text emitted so far (O(length): for final answers, not per step)."""
        return "".join(self._pieces)

    def take_new_text(self) -> str:
        """The text emitted since the previous call (O(new text)): each character once."""
        new = "".join(self._pieces[self._num_taken :])
        self._num_taken = len(self._pieces)
        return new

    @property
    def finished(self) -> bool:
        return self._done

    def add(self, token_id: int) -> None:
        if self._done:
            raise ValueError(
                "add() after the text was finished (stop string hit or finish() called)"
            )
        self._num_tokens += 1
        if self._skip_special and self._tokenizer.is_special(token_id):
            return
        self._text_chunk(self._decoder.decode(self._tokenizer.token_bytes(token_id)))

    def _text_chunk(self, chunk: str) -> None:
        if chunk and self._strip_pending:
            self._strip_pending = False
            chunk = chunk.removeprefix(" ")
        if chunk:
            self._consume(chunk)

    def finish(self) -> str:
        """Ends the text: drops the bytes of an incomplete trailing character, releases held-back
        text. CPython's incremental decoder also holds some bytes that can never complete (a
        surrogate's first two bytes, ED A0..BF) until the next byte shows them invalid: those
        become U+FFFD here, as decoding the whole output does (they may end on a stop string)."""
        if not self._done:
            buffered, _ = self._decoder.getstate()
            self._decoder.reset()
            if buffered and not _starts_a_character(buffered):
                self._text_chunk(buffered.decode("utf-8", errors="replace"))
        if not self._done:  # again: a stop string in that last chunk has ended the text
            self._pieces.append(self._held)
            self._held = ""
            self._done = True
        return self.text

    def _consume(self, chunk: str) -> None:
        if self._matcher is None:
            self._pieces.append(chunk)
            return
        armed = self._num_tokens > self._min_tokens
        pending = self._held + chunk
        offset = len(self._held)
        for i, ch in enumerate(chunk):
            hit = self._matcher.feed(ch)
            if hit is not None and armed:
                end = offset + i + 1
                self._pieces.append(pending[: end if self._include_stop else end - len(hit)])
                self._held = ""
                self.stop_string = hit
                self._done = True
                return
        keep = self._matcher.held  # <= len(pending): states only grow by the chars fed
        self._pieces.append(pending[: len(pending) - keep])
        self._held = pending[len(pending) - keep :]


def _starts_a_character(head: bytes) -> bool:
    """Whether some continuation bytes complete `head` (1-3 bytes) into one valid UTF-8
    character: its lead byte asks for more bytes and one choice of the next byte decodes (the
    only constraints past the lead are on the second byte: overlong forms, surrogates, >
    U+10FFFF)."""
    lead = head[0]
    length = 2 if 0xC2 <= lead <= 0xDF else 3 if 0xE0 <= lead <= 0xEF else 4 if lead <= 0xF4 else 0
    missing = length - len(head) if lead >= 0xC2 else 0
    if missing <= 0:
        return False
    for nxt in range(0x80, 0xC0):
        completed = head + bytes([nxt]) + b"\x80" * (missing - 1)
        try:
            completed.decode("utf-8")
        except UnicodeDecodeError:
            continue
        return True
    return False
