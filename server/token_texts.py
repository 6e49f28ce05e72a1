"""Token ids as the APIs show them: each token's text and bytes, and logprobs as JSON numbers.

Contract: `TokenTexts(tokenizer).get(token_id)` is `(text, raw bytes)`, cached per server; a
token that is not valid UTF-8 on its own reads "bytes:\\xNN..." (OpenAI's convention), and a
special token without bytes of its own is its decoded text. `clamp(logprob)` turns -inf into
-9999.0 (`MIN_LOGPROB`), since JSON has no infinity. Both APIs (OpenAI logprobs, TGI tokens)
use these.
"""

from __future__ import annotations

import math
from typing import Any

MIN_LOGPROB = -9999.0


def clamp(logprob: float | None) -> float | None:
    if logprob is None:
        return None
    return logprob if math.isfinite(logprob) else MIN_LOGPROB


class TokenTexts:
    """Token id -> the string and bytes the APIs show for it (cached per server)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, bytes]] = {}

    def get(self, token_id: int) -> tuple[str, bytes]:
        if token_id not in self._cache:
            raw = self._tokenizer.token_bytes(token_id)
            if not raw and self._tokenizer.is_special(token_id):
                raw = self._tokenizer.decode([token_id], skip_special_tokens=False).encode()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self._cache[token_id] = (text, raw)
        return self._cache[token_id]
