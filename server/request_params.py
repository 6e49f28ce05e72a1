"""API fields -> SamplingParams: the ONE place the HTTP edge maps onto engine parameters.

Contract: `completion_params`, `chat_params` and `tgi_params` turn a parsed request body into a
SamplingParams or raise `ApiError(400)` naming the field in the API's own vocabulary (e.g.
`max_new_tokens` on TGI routes); `api_fields(req)` is that vocabulary for the engine's
`InvalidRequest.field`, and `to_api_error` applies it to any refusal of the engine. Range checks live in SamplingParams; only rules that exist at
the HTTP edge (TGI's stricter ranges, options we refuse, option combinations) are checked here.
Defaults: an OpenAI request without `max_tokens` fills the context, as vLLM does: it passes
`max_tokens=None`, which the engine turns into the room left after the prompt in the context
and the KV cache (`EngineInfo.default_max_tokens`, so it always fits); TGI `max_new_tokens` 100. TGI decodes greedily unless `do_sample` or a sampling
knob asks otherwise, and always returns each token's logprob. The tests' `fault` field (a
FaultSpec, engine/faults.py) is a 400 naming it unless `allow_faults` (--enable-fault-injection).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from engine import FaultSpec, InvalidRequest, SamplingParams, StructuredOutput
from server.errors import ApiError
from server.schemas_openai import (
    ChatCompletionRequest,
    CompletionRequest,
    FaultFields,
    SamplingFields,
)
from server.schemas_structured import GuidedFields, ResponseFormat, TgiGrammar
from server.schemas_tgi import TgiParameters

TGI_DEFAULT_MAX_NEW_TOKENS = 100


def to_api_error(exc: ValueError, api_fields: Mapping[str, str] | None = None) -> ApiError:
    """A request the engine refused (SamplingParams or `new_request`), as a 400 whose `param`
    is the API field: the engine's `InvalidRequest.field` through `api_fields` (engine field
    name -> this route's; unlisted names are the same in the API). The message opens with the
    API field (TGI's error body has no `param`): in place of the engine's name for it, or
    before the engine's message."""
    if not isinstance(exc, InvalidRequest):
        return ApiError(400, str(exc))
    param = (api_fields or {}).get(exc.field, exc.field)
    message, name = exc.message, exc.field
    if message.startswith(name) and message[len(name) : len(name) + 1] in (" ", ":"):
        message = message[len(name) :]
    else:
        message = ": " + message
    return ApiError(400, param + message, param=param)


def _build(
    api_fields: Mapping[str, str] | None = None, *, max_tokens: int | None, **values: Any
) -> SamplingParams:
    """SamplingParams from the values given (None: the default), max_tokens as it is (None:
    the engine fills the context)."""
    try:
        given = {k: v for k, v in values.items() if v is not None}
        return SamplingParams(max_tokens=max_tokens, **given)
    except ValueError as exc:
        raise to_api_error(exc, api_fields) from None


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


def _fault(fault: FaultFields | None, allowed: bool) -> FaultSpec | None:
    """The tests' fault spec; refused (never ignored) unless --enable-fault-injection is on."""
    if fault is None:
        return None
    if not allowed:
        raise ApiError(
            400,
            "fault is a testing field, accepted only when the server runs with "
            "--enable-fault-injection",
            param="fault",
        )
    try:
        return FaultSpec(fault.fail_after_tokens, fault.kill_engine_after_tokens)
    except ValueError as exc:
        raise ApiError(400, str(exc), param="fault") from None


def _schema_text(value: dict[str, Any] | bool | str, field: str) -> str:
    """A schema given as an object or as JSON text, as JSON text (the engine checks it)."""
    if isinstance(value, str):
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            raise ApiError(400, f"{field} is not valid JSON: {exc}", param=field) from None
        return value
    return json.dumps(value)


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
    return StructuredOutput("json_schema", json.dumps(fmt.json_schema.schema_))


def _guided(req: GuidedFields) -> list[tuple[str, StructuredOutput]]:
    found = []
    if req.guided_json is not None:
        text = _schema_text(req.guided_json, "guided_json")
        found.append(("guided_json", StructuredOutput("json_schema", text)))
    if req.guided_regex is not None:
        found.append(("guided_regex", StructuredOutput("regex", req.guided_regex)))
    if req.guided_choice is not None:
        if not req.guided_choice:
            raise ApiError(
                400, "guided_choice must list at least one string", param="guided_choice"
            )
        found.append(("guided_choice", StructuredOutput.from_choices(req.guided_choice)))
    if req.guided_grammar is not None:
        found.append(("guided_grammar", StructuredOutput("grammar", req.guided_grammar)))
    return found


def _structured_field(req: GuidedFields | TgiParameters) -> str | None:
    """The API field a request's structured output (the engine's `structured_output`) came
    from, if any."""
    if isinstance(req, TgiParameters):
        return "grammar" if req.grammar is not None else None
    fmt = getattr(req, "response_format", None)
    names = ["response_format"] if fmt is not None and fmt.type != "text" else []
    names += [name for name, _ in _guided(req)]
    if getattr(req, "tool_choice", None) not in (None, "auto", "none"):
        names.append("tools")  # the grammar of an enforced tool_choice comes from the tools
    return names[0] if names else None


def api_fields(req: CompletionRequest | ChatCompletionRequest | TgiParameters) -> dict[str, str]:
    """How the engine's field names (`InvalidRequest.field`: "prompt" or a SamplingParams
    field) read in this request's API, where they differ; the server's 400s name these."""
    if isinstance(req, TgiParameters):
        names = {
            "prompt": "inputs",
            "max_tokens": "max_new_tokens",
            "logprobs": "top_n_tokens",
            "prompt_logprobs": "decoder_input_details",
        }
    elif isinstance(req, ChatCompletionRequest):
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


def _tgi_grammar(grammar: TgiGrammar | None) -> StructuredOutput | None:
    if grammar is None:
        return None
    if grammar.type == "json":
        return StructuredOutput("json_schema", _schema_text(grammar.value, "grammar"))
    if not isinstance(grammar.value, str):
        raise ApiError(400, "grammar of type regex needs a string value", param="grammar")
    return StructuredOutput("regex", grammar.value)


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
        "fault": _fault(req.fault, allow_faults),
        "structured_output": _structured(req, getattr(req, "response_format", None)),
    }


def completion_params(req: CompletionRequest, allow_faults: bool = False) -> SamplingParams:
    if req.suffix:
        raise ApiError(400, "suffix is not supported", param="suffix")
    echo_logprobs = req.logprobs if req.echo and req.logprobs is not None else None
    return _build(
        api_fields(req),
        max_tokens=req.max_tokens,
        logprobs=req.logprobs,
        prompt_logprobs=echo_logprobs,
        **_shared(req, allow_faults),
    )


def chat_params(
    req: ChatCompletionRequest,
    allow_faults: bool = False,
    tool_grammar: str | None = None,
    keep_special_tokens: bool = False,
) -> SamplingParams:
    """`tool_grammar`: the grammar `tool_choice` holds the output to (server/tool_calls/);
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
        shared["structured_output"] = StructuredOutput("grammar", tool_grammar)
    return _build(
        api_fields(req),
        max_tokens=max_tokens,
        logprobs=logprobs,
        **shared,
    )


def tgi_params(
    p: TgiParameters | None, allow_faults: bool = False, streamed: bool = True
) -> SamplingParams:
    p = p or TgiParameters()
    for name in ("typical_p", "adapter_id"):
        if getattr(p, name) is not None:
            raise ApiError(400, f"{name} is not supported by this server", param=name)
    if p.watermark:
        raise ApiError(400, "watermark is not supported by this server", param="watermark")
    if p.temperature is not None and p.temperature <= 0:
        raise ApiError(400, "temperature must be strictly positive", param="temperature")
    if p.top_p is not None and not 0 < p.top_p < 1:
        raise ApiError(400, "top_p must be > 0.0 and < 1.0", param="top_p")
    if p.top_k is not None and p.top_k <= 0:
        raise ApiError(400, "top_k must be strictly positive", param="top_k")
    if p.truncate is not None and p.truncate <= 0:
        raise ApiError(400, "truncate must be strictly positive", param="truncate")
    sampling = bool(p.do_sample) or any(
        (p.temperature not in (None, 1.0), p.top_k is not None, p.top_p is not None)
    )
    if p.best_of is not None and p.best_of > 1 and not sampling:
        raise ApiError(400, "best_of > 1 needs sampling: set do_sample to true", param="best_of")
    return _build(
        api_fields(p),
        max_tokens=p.max_new_tokens if p.max_new_tokens is not None else TGI_DEFAULT_MAX_NEW_TOKENS,
        temperature=(p.temperature or 1.0) if sampling else 0.0,
        top_k=p.top_k if sampling else None,
        top_p=p.top_p if sampling else None,
        repetition_penalty=p.repetition_penalty,
        frequency_penalty=p.frequency_penalty,
        stop=tuple(p.stop) if p.stop is not None else None,
        seed=p.seed,
        best_of=p.best_of if p.best_of and p.best_of > 1 else None,
        logprobs=p.top_n_tokens or 0,
        prompt_logprobs=0 if p.decoder_input_details else None,
        priority=p.priority,
        streamed=streamed,
        fault=_fault(p.fault, allow_faults),
        structured_output=_tgi_grammar(p.grammar),
    )
