"""OpenAI API response shapes: logprobs, usage, and the response or stream-chunk body.

Contract: builders return JSON-ready dicts in the OpenAI API's shapes: completions logprobs
`{tokens, token_logprobs, top_logprobs, text_offset}` (`CompletionLogprobs`, whose text_offset
keeps counting across a stream's chunks), chat logprobs `{content: [{token, logprob, bytes,
top_logprobs}]}`, usage `{prompt_tokens, completion_tokens, total_tokens}`, and `response_body`:
a whole response or one chunk. Token strings and clamped logprobs: server/token_texts.py.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from typing import Any

from engine import TokenLogprob
from server.token_texts import TokenTexts, clamp


class CompletionLogprobs:
    """Legacy completions logprobs of one choice; text_offset keeps counting across chunks."""

    def __init__(self, texts: TokenTexts) -> None:
        self._texts = texts
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._chars = 0

    def render(
        self, entries: Sequence[TokenLogprob | None], token_ids: Sequence[int]
    ) -> dict[str, Any]:
        """`entries[i]` scores `token_ids[i]` (None for the first prompt token)."""
        tokens, token_logprobs, tops, offsets = [], [], [], []
        for token_id, entry in zip(token_ids, entries, strict=True):
            text, raw = self._texts.get(token_id)
            tokens.append(text)
            offsets.append(self._chars)
            self._chars += len(self._decoder.decode(raw))
            token_logprobs.append(clamp(entry.logprob) if entry else None)
            if entry is None:
                tops.append(None)
                continue
            top = {self._texts.get(t)[0]: clamp(lp) for t, lp in entry.top}
            if entry.top:  # OpenAI lists the chosen token too
                top.setdefault(text, clamp(entry.logprob))
            tops.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def chat_logprobs(texts: TokenTexts, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text, raw = texts.get(token_id)
        return {"token": text, "logprob": clamp(logprob), "bytes": list(raw)}

    content = [
        {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
        for e in entries
    ]
    return {"content": content, "refusal": None}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def response_body(
    object_name: str,
    response_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage_: dict[str, int] | None,
    chunk: bool,
) -> dict[str, Any]:
    """A whole response (usage always present) or one stream chunk (usage only when given)."""
    body: dict[str, Any] = {
        "id": response_id,
        "object": object_name,
        "created": created,
        "model": model,
        "choices": choices,
        "system_fingerprint": None,
    }
    if usage_ is not None or not chunk:
        body["usage"] = usage_
    return body
