"""OpenAI request bodies -> SamplingParams: /v1/completions and /v1/chat/completions.

Contract: `completion_params` and `chat_params` turn a parsed request into a SamplingParams or
raise `ApiError(400)` naming the field (`param`); `api_fields(req)` is this request's name for
each engine field, for the engine's later refusals (server/engine_params.py). Range checks live
in SamplingParams; only rules that exist at the HTTP edge (options we refuse, option
combinations, structured-output fields given twice) are checked here. A request without
`max_tokens` fills the context, as vLLM does: `max_tokens=None` goes to the engine, which turns
it into the room left after the prompt in the context and the KV cache
(`EngineInfo.default_max_tokens`, so it always fits). Fields a request leaves unset take the
model folder's generation_config.json defaults (engine/requests/generation_defaults.py).
"""

from __future__ import annotations

import json
from typing import Any

from engine import GenerationDefaults, SamplingParams, StructuredOutput
from server.engine_params import build_params, fault_spec, schema_text, structured
from server.errors import ApiError
from server.openai.protocol import ChatCompletionRequest, CompletionRequest, SamplingFields
from server.structured_fields import GuidedFields, ResponseFormat


def _logit_bias(bias: dict[str, float] | None) -> dict[int, float] | None:
    if bias is None:
        return None
    try:
        return {int(key): value for key, value in bias.items()}
    except ValueError:
        raise ApiError(
            400, "logit_bias keys must be token ids (integers as strings)", param="logit_bias"
        ) from None


def _stop(stop: str | list[str] | None) -> tuple[str, ...] | None:
    if stop is None:
        return None
    return (stop,) if isinstance(stop, str) else tuple(stop)


def _response_format(fmt: ResponseFormat | None) -> StructuredOutput | None:
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object":
        return StructuredOutput("json_object")
    if fmt.json_schema is None:
        raise ApiError(
            400,
            "response_format of type json_schema needs a json_schema object",
            param="response_format",
        )
    if fmt.json_schema.schema_ is None:  # a name without a schema: any JSON object
        return StructuredOutput("json_object")
    return structured("json_schema", json.dumps(fmt.json_schema.schema_), "response_format")


def _guided(req: GuidedFields) -> list[tuple[str, StructuredOutput]]:
    found = []
    if req.guided_json is not None:
        text = schema_text(req.guided_json, "guided_json")
        found.append(("guided_json", structured("json_schema", text, "guided_json")))
    if req.guided_regex is not None:
        found.append(("guided_regex", structured("regex", req.guided_regex, "guided_regex")))
    if req.guided_choice is not None:
        if not req.guided_choice:
            raise ApiError(
                400, "guided_choice must list at least one string", param="guided_choice"
            )
        choices = json.dumps(req.guided_choice)
        found.append(("guided_choice", structured("choice", choices, "guided_choice")))
    if req.guided_grammar is not None:
        grammar = structured("grammar", req.guided_grammar, "guided_grammar")
        found.append(("guided_grammar", grammar))
    return found


def _structured_field(req: GuidedFields) -> str | None:
    """The API field a request's structured output (the engine's `structured_output`) came
    from, if any."""
    fmt = getattr(req, "response_format", None)
    names = ["response_format"] if fmt is not None and fmt.type != "text" else []
    names += [name for name, _ in _guided(req)]
    if getattr(req, "tool_choice", None) not in (None, "auto", "none"):
        names.append("tools")  # the grammar of an enforced tool_choice comes from the tools
    return names[0] if names else None


def api_fields(req: CompletionRequest | ChatCompletionRequest) -> dict[str, str]:
    """How the engine's field names (`InvalidRequest.field`: "prompt" or a SamplingParams
    field) read in this request, where they differ; its 400s name these."""
    if isinstance(req, ChatCompletionRequest):
        names = {
            "prompt": "messages",
            "logprobs": "top_logprobs",
            "max_tokens": (
                "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
            ),
        }
    else:
        names = {"prompt_logprobs": "logprobs"}  # prompt logprobs are asked by echo + logprobs
    structured = _structured_field(req)
    if structured is not None:
        names["structured_output"] = structured
    return names


def _structured(req: GuidedFields, fmt: ResponseFormat | None = None) -> StructuredOutput | None:
    found = _guided(req)
    from_format = _response_format(fmt)
    if from_format is not None:
        found.insert(0, ("response_format", from_format))
    if len(found) > 1:
        names = ", ".join(name for name, _ in found)
        raise ApiError(
            400, f"give at most one structured-output field, got {names}", param=found[1][0]
        )
    return found[0][1] if found else None


def _shared(req: SamplingFields, allow_faults: bool) -> dict[str, Any]:
    if req.stream and req.best_of is not None and req.best_of > (req.n or 1):
        raise ApiError(400, "best_of > n cannot be streamed; set stream to false", param="best_of")
    return {
        "n": req.n,
        "best_of": req.best_of,
        # Beam search without an explicit temperature is plain (deterministic) beam search.
        "temperature": 0.0 if req.use_beam_search and req.temperature is None else req.temperature,
        "top_p": req.top_p,
        "top_k": req.top_k,
        "min_p": req.min_p,
        "presence_penalty": req.presence_penalty,
        "frequency_penalty": req.frequency_penalty,
        "repetition_penalty": req.repetition_penalty,
        "logit_bias": _logit_bias(req.logit_bias),
        "seed": req.seed,
        "stop": _stop(req.stop),
        "stop_token_ids": tuple(req.stop_token_ids) if req.stop_token_ids is not None else None,
        "ignore_eos": req.ignore_eos,
        "min_tokens": req.min_tokens,
        "use_beam_search": req.use_beam_search,
        "length_penalty": req.length_penalty,
        "include_stop_str_in_output": req.include_stop_str_in_output,
        "skip_special_tokens": req.skip_special_tokens,
        "priority": req.priority,
        "streamed": bool(req.stream),
        "fault": fault_spec(req.fault, allow_faults),
        "structured_output": _structured(req, getattr(req, "response_format", None)),
    }


def completion_params(
    req: CompletionRequest,
    allow_faults: bool = False,
    defaults: GenerationDefaults | None = None,
) -> SamplingParams:
    """`defaults`: the model folder's generation_config.json (EngineInfo.generation)."""
    if req.suffix:
        raise ApiError(400, "suffix is not supported", param="suffix")
    echo_logprobs = req.logprobs if req.echo and req.logprobs is not None else None
    return build_params(
        api_fields(req),
        max_tokens=req.max_tokens,
        defaults=defaults,
        logprobs=req.logprobs,
        prompt_logprobs=echo_logprobs,
        **_shared(req, allow_faults),
    )


def chat_params(
    req: ChatCompletionRequest,
    allow_faults: bool = False,
    tool_grammar: str | None = None,
    keep_special_tokens: bool = False,
    defaults: GenerationDefaults | None = None,
) -> SamplingParams:
    """`defaults`: as `completion_params`'; `tool_grammar`: the grammar `tool_choice` holds the output to (server/chat/tool_calls/);
    `keep_special_tokens`: the tool-call format writes special tokens, which the text must
    keep unless the request says otherwise."""
    if req.top_logprobs is not None and not req.logprobs:
        raise ApiError(400, "top_logprobs needs logprobs set to true", param="top_logprobs")
    max_tokens = (
        req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    )
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    shared = _shared(req, allow_faults)
    if keep_special_tokens and req.skip_special_tokens is None:
        shared["skip_special_tokens"] = False
    if tool_grammar is not None:
        if shared["structured_output"] is not None:
            field = _structured_field(req)
            raise ApiError(
                400,
                f"tool_choice {req.tool_choice!r} already constrains the output; it cannot be "
                f"combined with {field}",
                param=field,
            )
        shared["structured_output"] = structured("grammar", tool_grammar, "tools")
    return build_params(
        api_fields(req),
        max_tokens=max_tokens,
        defaults=defaults,
        logprobs=logprobs,
        **shared,
    )
