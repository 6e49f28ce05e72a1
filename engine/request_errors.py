"""InvalidRequest: a request the engine refuses, naming the request field that is wrong.

Contract: every check the engine makes on a request's input (SamplingParams' ranges, the prompt's
token ids and length, max_tokens against the context and the KV cache, n / best_of against the
batch, stop strings, logit_bias and stop_token_ids against the vocabulary, beam-search rules, a
structured output that does not compile) raises `InvalidRequest(field, message)`. `field` is the
engine's name for it: "prompt" (the prompt's token ids) or a `SamplingParams` field name. The
server maps it onto its API's own field (OpenAI `param`, TGI's names) from this attribute, never
from the message text. It is a ValueError, so callers that only know ValueError still catch it.
"""

from __future__ import annotations

PROMPT = "prompt"  # the field of checks on the prompt's token ids


class InvalidRequest(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message
