"""TGI (text-generation-inference) API shapes: request body and response / stream builders.

Contract: `TgiRequest` describes `{"inputs", "parameters", "stream"}` as TGI accepts it (unknown
fields ignored); mapping `parameters` to SamplingParams lives in server/tgi/params.py. Builders return
JSON-ready dicts: `/generate` -> `{"generated_text", "details"?}`, stream events `{"index",
"token": {id, text, logprob, special}, "generated_text", "details"}` where only the last event
carries `generated_text` and `details.finish_reason`. Finish reasons use TGI's names
(`length`, `eos_token`, `stop_sequence`), plus `abort` / `error` for ours.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict

from engine import CompletionOutput, TokenLogprob
from server.engine_params import FaultFields
from server.structured_fields import TgiGrammar
from server.token_texts import clamp


class _Body(BaseModel):
    # Each field's docstring is its description in the OpenAPI document (server/openapi.py).
    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)


class TgiParameters(_Body):
    max_new_tokens: int | None = None
    """Tokens to generate at most, >= 1 (default 100)."""
    do_sample: bool | None = None
    """Sample instead of greedy decoding (default false; a temperature other than 1, top_k or
    top_p turn sampling on too)."""
    temperature: float | None = None
    """Sampling temperature, > 0 (TGI refuses 0; use do_sample false for greedy)."""
    top_k: int | None = None
    """Sample among the k most likely tokens, > 0."""
    top_p: float | None = None
    """Nucleus sampling, in (0, 1)."""
    repetition_penalty: float | None = None
    """Divides positive (multiplies negative) logits of tokens already seen, in [0.01, 100];
    1 is off."""
    frequency_penalty: float | None = None
    """Subtracted from a token's logit per time it was generated, in [-2, 2]."""
    stop: list[str] | None = None
    """Up to 16 strings (1 to 256 characters each) that end the generation."""
    seed: int | None = None
    """In [0, 2**63): a seeded request gets the same tokens whatever else runs beside it."""
    details: bool | None = None
    """Return details: finish reason, generated tokens, seed, the tokens with their log
    probabilities."""
    decoder_input_details: bool | None = None
    """With details: also the prompt's tokens and log probabilities (prefill)."""
    return_full_text: bool | None = None
    """Prepend the input to generated_text (default false)."""
    top_n_tokens: int | None = None
    """With details: the this many most likely tokens at each position, 0 to 20."""
    best_of: int | None = None
    """Sequences to sample, 1 to 16 (needs do_sample); the most likely is returned, the others in
    details.best_of_sequences."""
    truncate: int | None = None
    """Keep only the last this many tokens of the input, >= 1."""
    typical_p: float | None = None
    """Typical sampling; refused unless null (not supported)."""
    watermark: bool | None = None
    """Watermarking; refused unless false (not supported)."""
    grammar: TgiGrammar | None = None
    """Constrain the answer to a JSON Schema or a regular expression."""
    adapter_id: str | None = None
    """A LoRA adapter; refused unless null (not supported)."""
    timeout: float | None = None
    """tgserve's: seconds, > 0; the request is aborted after this, queued or running."""
    priority: int | None = None
    """tgserve's: an integer in [-2**31, 2**31), lower runs first (default 0); below 0 only for
    keys in --priority-keys."""
    fault: FaultFields | None = None
    """Tests only, with --enable-fault-injection: fail this request or kill the engine after some
    tokens."""


class TgiRequest(_Body):
    inputs: str
    """The prompt text (not empty)."""
    parameters: TgiParameters | None = None
    """Generation parameters (TGI's defaults: greedy, 100 new tokens)."""
    stream: bool | None = None
    """POST / only: answer as /generate_stream does (server-sent events) when true, else as
    /generate."""


def finish_reason(output: CompletionOutput) -> str | None:
    if output.finish_reason == "stop":
        return "stop_sequence" if isinstance(output.stop_reason, str) else "eos_token"
    return output.finish_reason


def token(token_id: int, text: str, logprob: float | None, special: bool) -> dict[str, Any]:
    return {"id": token_id, "text": text, "logprob": clamp(logprob), "special": special}


def top_tokens(entry: TokenLogprob | None, texts: Any, tokenizer: Any) -> list[dict[str, Any]]:
    if entry is None:
        return []
    return [token(t, texts.get(t)[0], lp, tokenizer.is_special(t)) for t, lp in entry.top]


def details(
    output: CompletionOutput,
    seed: int | None,
    tokens: list[dict[str, Any]],
    prefill: list[dict[str, Any]],
    top: list[list[dict[str, Any]]] | None,
) -> dict[str, Any]:
    body: dict[str, Any] = {
        "finish_reason": finish_reason(output),
        "generated_tokens": len(output.token_ids),
        "seed": seed,
        "prefill": prefill,
        "tokens": tokens,
    }
    if top is not None:
        body["top_tokens"] = top
    return body


def stream_event(
    index: int,
    tok: dict[str, Any],
    top: list[dict[str, Any]] | None,
    generated_text: str | None,
    final_details: dict[str, Any] | None,
) -> dict[str, Any]:
    event: dict[str, Any] = {
        "index": index,
        "token": tok,
        "generated_text": generated_text,
        "details": final_details,
    }
    if top is not None:
        event["top_tokens"] = top
    return event
