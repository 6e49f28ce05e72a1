"""The errors the engine raises to its callers, each telling them what to do.

Contract:
- `InvalidRequest(field, message)`: a request the engine refuses. Every check the engine makes
  on a request's input (SamplingParams' ranges, the prompt's token ids and length, max_tokens
  against the context and the KV cache, n / best_of against the batch, stop strings, logit_bias
  and stop_token_ids against the vocabulary, beam-search rules, a structured output that does
  not compile) raises it. `field` is the engine's name for the field at fault: "prompt" (the
  prompt's token ids) or a `SamplingParams` field name. The server maps it onto its API's own
  field (OpenAI `param`, TGI's names) from this attribute, never from the message text. It is a
  ValueError, so callers that only know ValueError still catch it.
- `QueueFullError`: the waiting queue is at `max_queued_requests` (the server answers 429).
- `Overloaded` and `EngineUnavailable`: why `AsyncEngine.generate` refused a request.
- `FatalEngineError`: raised by `step()` when the engine cannot go on; `AsyncEngine` stops its
  loop at once (other exceptions fail the step's requests and the loop retries).
"""

from __future__ import annotations

PROMPT = "prompt"  # the field of checks on the prompt's token ids


class InvalidRequest(ValueError):
    def __init__(self, field: str, message: str) -> None:
        super().__init__(message)
        self.field = field
        self.message = message


class QueueFullError(ValueError):
    """The waiting queue is at max_queued_requests (the server answers 429)."""


class Overloaded(Exception):
    """Too many requests are admitted already; retry after `retry_after` seconds."""

    def __init__(self, message: str, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class EngineUnavailable(Exception):
    """The engine is shutting down or its loop has died; no new request is taken."""


class FatalEngineError(Exception):
    """The engine cannot go on (e.g. an injected kill, engine/requests/fault_spec.py): the loop
    must stop."""
