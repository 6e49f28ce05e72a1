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
    model_config = ConfigDict(extra="ignore")


class TgiParameters(_Body):
    max_new_tokens: int | None = None
    do_sample: bool | None = None
    temperature: float | None = None
    top_k: int | None = None
    top_p: float | None = None
    repetition_penalty: float | None = None
    frequency_penalty: float | None = None
    stop: list[str] | None = None
    seed: int | None = None
    details: bool | None = None
    decoder_input_details: bool | None = None
    return_full_text: bool | None = None
    top_n_tokens: int | None = None
    best_of: int | None = None
    truncate: int | None = None
    typical_p: float | None = None
    watermark: bool | None = None
    grammar: TgiGrammar | None = None
    adapter_id: str | None = None
    timeout: float | None = None  # seconds; an extension of ours
    priority: int | None = None  # ours too: lower runs first (as vLLM's); default 0
    fault: FaultFields | None = None  # ours, tests only: 422 unless --enable-fault-injection


class TgiRequest(_Body):
    inputs: str
    parameters: TgiParameters | None = None
    stream: bool | None = None


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
