"""TGI `parameters` -> SamplingParams: /generate, /generate_stream and POST /.

Contract: `tgi_params(parameters, allow_faults, streamed)` is a SamplingParams, or an
`ApiError(400)` (TGI's 422) naming the field in TGI's words (`max_new_tokens`, `top_n_tokens`,
...); `api_fields(parameters)` is TGI's name for each engine field, for the engine's later
refusals (server/engine_params.py). TGI's stricter ranges and the options we refuse are checked
here. `max_new_tokens` defaults to 100. TGI decodes greedily unless `do_sample` or a sampling
knob asks otherwise, and always returns each token's logprob.
"""

from __future__ import annotations

from engine import SamplingParams, StructuredOutput
from server.engine_params import build_params, fault_spec, schema_text, structured
from server.errors import ApiError
from server.structured_fields import TgiGrammar
from server.tgi.protocol import TgiParameters

TGI_DEFAULT_MAX_NEW_TOKENS = 100


def api_fields(p: TgiParameters) -> dict[str, str]:
    """How the engine's field names (`InvalidRequest.field`) read in TGI's API."""
    names = {
        "prompt": "inputs",
        "max_tokens": "max_new_tokens",
        "logprobs": "top_n_tokens",
        "prompt_logprobs": "decoder_input_details",
    }
    if p.grammar is not None:
        names["structured_output"] = "grammar"
    return names


def _tgi_grammar(grammar: TgiGrammar | None) -> StructuredOutput | None:
    if grammar is None:
        return None
    if grammar.type == "json":
        return structured("json_schema", schema_text(grammar.value, "grammar"), "grammar")
    if not isinstance(grammar.value, str):
        raise ApiError(400, "grammar of type regex needs a string value", param="grammar")
    return structured("regex", grammar.value, "grammar")


def tgi_params(
    p: TgiParameters | None, allow_faults: bool = False, streamed: bool = True
) -> SamplingParams:
    p = p or TgiParameters()
    for name in ("typical_p",):
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
    return build_params(
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
        fault=fault_spec(p.fault, allow_faults),
        structured_output=_tgi_grammar(p.grammar),
    )
