"""A Responses API request as a chat conversation, a ToolPlan and SamplingParams.

Contract: `refuse_unsupported(req)` is a 400 naming the first field tgserve cannot honour.
`input_turns(req)` turns `input` into OpenAI chat message dicts (the form server/chat renders):
messages keep their role and text; a `function_call` joins the assistant turn before it (or
opens one) as a tool call; a `function_call_output` is a `tool` turn; `reasoning` items are
not shown to the model again. Each bad item is a 400 naming its field (`input.1.call_id`).
`tool_plan(req)` checks the function tools and `tool_choice`; `response_params(...)` is the
SamplingParams (`text.format` through the structured-output engine); `API_FIELDS` names the
engine's fields as this API does.
"""

from __future__ import annotations

import json
from typing import Any

from engine import GenerationDefaults, SamplingParams, StructuredOutput
from server.chat.tool_calls.plan import ToolPlan, check_function, check_unique
from server.engine_params import build_params
from server.errors import ApiError
from server.responses.protocol import ContentPart, InputItem, NamedFunction, ResponsesRequest

API_FIELDS = {"prompt": "input", "max_tokens": "max_output_tokens", "structured_output": "text"}
_TEXT_PARTS = frozenset({"input_text", "output_text", "text", "summary_text", "reasoning_text"})


def refuse_unsupported(req: ResponsesRequest) -> None:
    refused = {
        "background": "background mode is not supported; leave it unset or false",
        "prompt": "stored prompts are not supported; send the input itself",
        "conversation": "conversations are not supported; use previous_response_id",
        "top_logprobs": "logprobs are not supported on /v1/responses",
    }
    for field, why in refused.items():
        if getattr(req, field) not in (None, False, 0):
            raise ApiError(400, f"{field}: {why}", param=field)
    if req.metadata is not None and len(req.metadata) > 16:
        raise ApiError(400, "metadata holds at most 16 pairs", param="metadata")


def _text(parts: str | list[ContentPart] | None, where: str) -> str:
    if parts is None or isinstance(parts, str):
        return parts or ""
    for j, part in enumerate(parts):
        if part.type not in _TEXT_PARTS:
            raise ApiError(
                400,
                f"{where}.{j}.type: {part.type!r} is not supported; send text parts",
                param=f"{where}.{j}.type",
            )
    return "".join(part.text or "" for part in parts)


def input_turns(req: ResponsesRequest) -> list[dict[str, Any]]:
    if isinstance(req.input, str):
        return [{"role": "user", "content": req.input}]
    turns: list[dict[str, Any]] = []
    for i, item in enumerate(req.input):
        _add_item(turns, item, f"input.{i}")
    return turns


def _need(value: str | None, where: str, field: str, kind: str) -> str:
    if value is None:
        raise ApiError(400, f"{where}.{field}: a {kind} item needs it", param=f"{where}.{field}")
    return value


def _add_item(turns: list[dict[str, Any]], item: InputItem, where: str) -> None:
    kind = item.type or ("message" if item.role is not None else None)
    if kind == "message":
        role = _need(item.role, where, "role", "message")
        turns.append({"role": role, "content": _text(item.content, f"{where}.content")})
    elif kind == "function_call":
        call_id = _need(item.call_id, where, "call_id", kind)
        function = {
            "name": _need(item.name, where, "name", kind),
            "arguments": item.arguments or "{}",
        }
        call = {"id": call_id, "type": "function", "function": function}
        if not turns or turns[-1]["role"] != "assistant":
            turns.append({"role": "assistant", "content": ""})
        turns[-1].setdefault("tool_calls", []).append(call)
    elif kind == "function_call_output":
        call_id = _need(item.call_id, where, "call_id", kind)
        output = _text(item.output, f"{where}.output")
        turns.append({"role": "tool", "tool_call_id": call_id, "content": output})
    elif kind != "reasoning":  # reasoning: not shown to the model again
        raise ApiError(
            400,
            f"{where}.type: {kind!r} items are not supported (message, function_call, "
            "function_call_output and reasoning are)",
            param=f"{where}.type",
        )


def tool_plan(req: ResponsesRequest) -> ToolPlan | None:
    if not req.tools:
        if req.tool_choice not in (None, "none", "auto"):
            raise ApiError(
                400, "tool_choice: only allowed when tools are given", param="tool_choice"
            )
        return None
    functions = []
    for i, tool in enumerate(req.tools):
        if tool.type != "function":
            raise ApiError(
                400,
                f"tools.{i}.type: built-in tools ({tool.type!r}) are not supported; give "
                "function tools",
                param=f"tools.{i}.type",
            )
        name = _need(tool.name, f"tools.{i}", "name", "function")
        functions.append(check_function(name, tool.description, tool.parameters, f"tools.{i}"))
    names = check_unique(tuple(functions), "tools.{i}.name")
    choice = req.tool_choice or "auto"
    parallel = req.parallel_tool_calls is not False
    if isinstance(choice, NamedFunction):
        if choice.type != "function" or choice.name not in names:
            raise ApiError(
                400,
                f"tool_choice: name one of the function tools ({', '.join(sorted(names))})",
                param="tool_choice",
            )
        return ToolPlan(tuple(functions), "function", choice.name, parallel)
    return ToolPlan(tuple(functions), choice, None, parallel)


def _structured(req: ResponsesRequest) -> StructuredOutput | None:
    fmt = req.text.format if req.text is not None else None
    if fmt is None or fmt.type == "text":
        return None
    if fmt.type == "json_object" or fmt.schema_ is None:
        return StructuredOutput("json_object")
    return StructuredOutput("json_schema", json.dumps(fmt.schema_))


def response_params(
    req: ResponsesRequest,
    grammar: str | None,
    keep_special_tokens: bool,
    defaults: GenerationDefaults | None,
) -> SamplingParams:
    structured = _structured(req)
    if grammar is not None:
        if structured is not None:
            raise ApiError(
                400,
                "text.format: a tool_choice that forces calls already constrains the answer",
                param="text.format",
            )
        structured = StructuredOutput("grammar", grammar)
    return build_params(
        API_FIELDS,
        max_tokens=req.max_output_tokens,
        defaults=defaults,
        temperature=req.temperature,
        top_p=req.top_p,
        skip_special_tokens=False if keep_special_tokens else None,
        structured_output=structured,
        streamed=bool(req.stream),
    )
