"""What both APIs share in turning a request into SamplingParams, and the engine's refusals
into 400s naming the API's field.

Contract: `build_params(api_fields, max_tokens=..., defaults=..., **values)` is SamplingParams
from the values given (None: generation_config.json's default where `defaults` has one, else
the engine's; `max_tokens=None`: the engine fills the context; greedy n > 1 runs as n = 1, its
one sequence copied into the n choices by the caller), or the
engine's refusal as `to_api_error`. `to_api_error(exc, api_fields)`: an `InvalidRequest` becomes
an `ApiError(400)` whose `param` is the API's name for the engine's `InvalidRequest.field`
(`api_fields`: engine field -> this route's, unlisted names are the same) and whose message
opens with it (TGI's error body has no `param`), read from the attribute, never the message.
`fault_spec` maps the tests' `fault` field (`FaultFields`, engine/faults.py): a 400 naming it
unless `allowed` (--enable-fault-injection). `schema_text` checks a JSON schema given as text
(a 400 when it is not JSON or nests arrays / objects deeper than MAX_JSON_DEPTH, 512: an explicit
bound, since the interpreter's recursion limit is a process-wide setting any library may raise);
`structured(kind,
value, field)` is the engine's StructuredOutput, or a 400 naming `field` (e.g. over 1 MiB).
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

from engine import (
    GREEDY_BELOW_TEMPERATURE,
    FaultSpec,
    GenerationDefaults,
    InvalidRequest,
    SamplingParams,
    StructuredOutput,
)
from server.errors import ApiError


class FaultFields(BaseModel):
    """Tests only (--enable-fault-injection): exactly one of these, counted in generated tokens;
    see engine/faults.py. Unknown keys are refused, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid", use_attribute_docstrings=True)
    fail_after_tokens: int | None = None
    """Fail this request (finish_reason error) after this many generated tokens, >= 0."""
    kill_engine_after_tokens: int | None = None
    """Kill the engine loop (the server exits for its orchestrator to restart it) after this many
    generated tokens, >= 0."""


def to_api_error(exc: ValueError, api_fields: Mapping[str, str] | None = None) -> ApiError:
    """A request the engine refused (SamplingParams or `new_request`), as a 400 naming the
    API's field; a plain ValueError (no field known) keeps its message and names none."""
    if not isinstance(exc, InvalidRequest):
        return ApiError(400, str(exc))
    param = (api_fields or {}).get(exc.field, exc.field)
    # Most engine messages open with the engine's field name ("max_tokens must be at least 1"):
    # the API's name takes its place rather than repeating it after a prefix.
    if exc.message.startswith((f"{exc.field} ", f"{exc.field}: ")):  # "x: ..." stays one "x:"
        return ApiError(400, param + exc.message[len(exc.field) :], param=param)
    return ApiError(400, f"{param}: {exc.message}", param=param)


def build_params(
    api_fields: Mapping[str, str],
    *,
    max_tokens: int | None,
    defaults: GenerationDefaults | None = None,
    **values: Any,
) -> SamplingParams:
    """SamplingParams from the values given (None: the model folder's `defaults` if it has
    one, else SamplingParams' default), max_tokens as it is (None: the engine fills the
    context, within the folder's bound)."""
    if defaults is not None:
        values = defaults.fill(values)
    values = _one_greedy_sequence(values)
    try:
        given = {k: v for k, v in values.items() if v is not None}
        return SamplingParams(max_tokens=max_tokens, **given)
    except ValueError as exc:
        raise to_api_error(exc, api_fields) from None


def _one_greedy_sequence(values: dict[str, Any]) -> dict[str, Any]:
    """Greedy decoding with n > 1 (no beam search): every choice is the one greedy sequence, so
    the engine runs it once and the OpenAI routes copy it into the n choices, as OpenAI answers
    (server/openai/job.py `Job.copies`). A best_of beyond n stays the engine's refusal."""
    n, temperature = values.get("n") or 1, values.get("temperature")
    # The engine's greedy rule: temperature 0 or below its floor (SamplingParams.greedy).
    greedy = isinstance(temperature, int | float) and 0 <= temperature < GREEDY_BELOW_TEMPERATURE
    if n == 1 or not greedy or values.get("use_beam_search"):
        return values
    best_of = values.get("best_of")
    return {**values, "n": 1, "best_of": None if best_of == n else best_of}


def fault_spec(fault: FaultFields | None, allowed: bool) -> FaultSpec | None:
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


MAX_JSON_DEPTH = 512  # arrays / objects in a schema given as text; real schemas nest < 50
_JSON_STRING = re.compile(r'"(?:[^"\\]|\\.)*"')
_BRACKET = re.compile(r"[\[\]{}]")


def nests_too_deeply(text: str) -> bool:
    """Whether JSON text nests arrays / objects past MAX_JSON_DEPTH (brackets inside strings
    ignored); linear, the scanning done by `re` (a 1 MiB text in milliseconds)."""
    if text.count("[") + text.count("{") <= MAX_JSON_DEPTH:
        return False  # too few brackets to nest that deep: no scan
    depth = 0
    for bracket in _BRACKET.finditer(_JSON_STRING.sub("", text)):
        depth += 1 if bracket.group() in "[{" else -1
        if depth > MAX_JSON_DEPTH:
            return True
    return False


def schema_text(value: dict[str, Any] | bool | str, field: str) -> str:
    """A schema given as an object or as JSON text, as JSON text (the engine checks it)."""
    if isinstance(value, str):
        if nests_too_deeply(value):
            raise ApiError(400, f"{field} nests deeper than {MAX_JSON_DEPTH} levels", param=field)
        try:
            json.loads(value)
        except json.JSONDecodeError as exc:
            raise ApiError(400, f"{field} is not valid JSON: {exc}", param=field) from None
        except RecursionError:  # Python's parser gives up near 1000 levels
            raise ApiError(400, f"{field} is nested too deeply", param=field) from None
        return value
    return json.dumps(value)


def structured(kind: str, value: str, field: str) -> StructuredOutput:
    """The engine's constraint of this kind, or a 400 naming the request's field."""
    try:
        return StructuredOutput(kind, value)  # type: ignore[arg-type]  # checked there
    except ValueError as exc:
        message = str(exc).removeprefix("structured_output ")
        raise ApiError(400, f"{field}: {message}", param=field) from None
