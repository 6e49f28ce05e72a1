"""Chat messages with tools, as a model's chat template wants them.

Contract: `template_inputs(messages, plan, parser, takes_tools)` takes the conversation as OpenAI
chat message dicts (`role`, `content` text, assistant `tool_calls` as `{id, type, function: {name,
arguments}}`, `tool_call_id`; every API converts its own input to them) and returns the message
dicts and the extra template variables for `apply_chat_template`. A template that reads `tools` gets them (when
the plan shows tools to the model) and the history as OpenAI sends it, except that each call's
`arguments` JSON text becomes an object when it parses (templates render it with `tojson`). A
template that does not read `tools` gets a Hermes-style fallback: a system prompt listing the
functions as JSON and showing the call format of `parser`, assistant calls written in that format
after the message's text, and `tool` messages as user turns wrapped in `<tool_response>` (merged
when several answer one turn), so templates that know only system/user/assistant render them.
"""

from __future__ import annotations

import json
from typing import Any

from server.chat.tool_calls.base import FunctionSpec, ToolParser
from server.chat.tool_calls.events import ToolCall
from server.chat.tool_calls.plan import ToolPlan

_FALLBACK_INTRO = (
    "You can call functions to help you answer. Each function is described by a JSON object "
    "between the <tools></tools> tags:\n<tools>\n{tools}\n</tools>\n\n"
    "To call a function, answer with its name and its arguments as a JSON object, like this:\n"
    "{example}"
)


def tool_specs(functions: tuple[FunctionSpec, ...]) -> list[dict[str, Any]]:
    specs = []
    for f in functions:
        function: dict[str, Any] = {"name": f.name}
        if f.description is not None:
            function["description"] = f.description
        function["parameters"] = f.parameters
        specs.append({"type": "function", "function": function})
    return specs


def template_inputs(
    messages: list[dict[str, Any]], plan: ToolPlan | None, parser: ToolParser, takes_tools: bool
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    shown = plan is not None and plan.parses_calls
    if takes_tools:
        dicts = [_with_argument_objects(m) for m in messages]
        return dicts, ({"tools": tool_specs(plan.functions)} if shown else {})
    dicts = _fallback_history(messages, parser)
    if shown:
        dicts = _with_system_text(dicts, _fallback_prompt(plan.functions, parser))
    return dicts, {}


def _with_argument_objects(message: dict[str, Any]) -> dict[str, Any]:
    if not message.get("tool_calls"):
        return message
    calls = [{**c, "function": dict(c["function"])} for c in message["tool_calls"]]
    message = {**message, "tool_calls": calls}  # copies: the caller's dicts stay as they are
    for call in calls:
        try:
            arguments = json.loads(call["function"]["arguments"])
        except (json.JSONDecodeError, RecursionError):  # rendered as the text it is
            continue
        if isinstance(arguments, dict):
            call["function"]["arguments"] = arguments
    return message


def _fallback_history(messages: list[dict[str, Any]], parser: ToolParser) -> list[dict[str, Any]]:
    dicts: list[dict[str, Any]] = []
    for m in messages:
        text = m.get("content") or ""
        if m["role"] == "tool":
            answer = f"<tool_response>\n{text}\n</tool_response>"
            if dicts and dicts[-1].get("tool_responses"):
                dicts[-1]["content"] += "\n" + answer
            else:
                dicts.append({"role": "user", "content": answer, "tool_responses": True})
            continue
        if m["role"] == "assistant" and m.get("tool_calls"):
            calls = [
                ToolCall(c["function"]["name"], c["function"]["arguments"]) for c in m["tool_calls"]
            ]
            written = parser.render_calls(calls)
            text = f"{text}\n{written}" if text else written
        dicts.append({"role": m["role"], "content": text})
    for d in dicts:
        d.pop("tool_responses", None)
    return dicts


def _fallback_prompt(functions: tuple[FunctionSpec, ...], parser: ToolParser) -> str:
    tools = "\n".join(json.dumps(spec, ensure_ascii=False) for spec in tool_specs(functions))
    example = parser.render_calls([ToolCall("<function-name>", "<arguments-json-object>")])
    return _FALLBACK_INTRO.format(tools=tools, example=example)


def _with_system_text(dicts: list[dict[str, Any]], text: str) -> list[dict[str, Any]]:
    """The tool prompt joins the first system message, or opens the conversation as one."""
    if dicts and dicts[0]["role"] in ("system", "developer"):
        first = dict(dicts[0], content=f"{dicts[0]['content']}\n\n{text}".lstrip())
        return [first, *dicts[1:]]
    return [{"role": "system", "content": text}, *dicts]
