"""An Anthropic Messages request as a chat conversation, a ToolPlan and SamplingParams.

Contract: `conversation(req)` turns `system` and `messages` into OpenAI chat message dicts (the
form server/chat renders): text blocks join into one turn's text; an assistant's `tool_use`
blocks become its `tool_calls` (the input as JSON text); a user's `tool_result` blocks become
`tool` turns (before the turn's text), an error result marked as one; thinking blocks are not
shown to the model again. `tool_plan(req)` checks `tools` / `tool_choice` (server tools and
a tool_choice naming no tool are 400s naming the field): auto / any / tool / none map to
auto / required / the named function / none. `message_params(...)` is the SamplingParams;
`API_FIELDS` names the engine's fields as this API does (its 400s name them).
"""

from __future__ import annotations

import json
from typing import Any

from engine import GenerationDefaults, SamplingParams, StructuredOutput
from server.anthropic.protocol import (
    ConversationFields,
    MessagesRequest,
    TextBlock,
    ToolResultBlock,
    ToolUseBlock,
)
from server.chat.tool_calls.plan import ToolPlan, check_function, check_unique, unknown_choice
from server.engine_params import build_params
from server.errors import ApiError

API_FIELDS = {"prompt": "messages", "stop": "stop_sequences", "structured_output": "tool_choice"}
_CHOICES = {"auto": "auto", "any": "required", "tool": "function", "none": "none"}


def conversation(req: ConversationFields) -> list[dict[str, Any]]:
    turns: list[dict[str, Any]] = []
    if req.system:
        turns.append({"role": "system", "content": _text(req.system)})
    for i, message in enumerate(req.messages):
        if isinstance(message.content, str):
            turns.append({"role": message.role, "content": message.content})
            continue
        where = f"messages.{i}.content"
        if message.role == "user":
            turns += _user_turns(message.content, where)
        else:
            turns.append(_assistant_turn(message.content, where))
    return turns


def _text(content: str | list[TextBlock] | None) -> str:
    if content is None or isinstance(content, str):
        return content or ""
    return "".join(block.text for block in content)


def _user_turns(blocks: list[Any], where: str) -> list[dict[str, Any]]:
    results, text = [], ""
    for j, block in enumerate(blocks):
        if isinstance(block, ToolResultBlock):
            answer = _text(block.content)
            answer = f"(the call failed) {answer}" if block.is_error else answer
            results.append({"role": "tool", "tool_call_id": block.tool_use_id, "content": answer})
        elif isinstance(block, TextBlock):
            text += block.text
        elif isinstance(block, ToolUseBlock):
            raise ApiError(
                400, f"{where}.{j}: tool_use blocks belong to assistant turns", param=f"{where}.{j}"
            )
    return results + ([{"role": "user", "content": text}] if text or not results else [])


def _assistant_turn(blocks: list[Any], where: str) -> dict[str, Any]:
    text, calls = "", []
    for j, block in enumerate(blocks):
        if isinstance(block, TextBlock):
            text += block.text
        elif isinstance(block, ToolUseBlock):
            arguments = json.dumps(block.input, ensure_ascii=False)
            function = {"name": block.name, "arguments": arguments}
            calls.append({"id": block.id, "type": "function", "function": function})
        elif isinstance(block, ToolResultBlock):
            raise ApiError(
                400, f"{where}.{j}: tool_result blocks belong to user turns", param=f"{where}.{j}"
            )
    turn: dict[str, Any] = {"role": "assistant", "content": text}
    if calls:
        turn["tool_calls"] = calls
    return turn


def tool_plan(req: ConversationFields) -> ToolPlan | None:
    choice = req.tool_choice
    if not req.tools:
        if choice is not None and choice.type != "none":
            raise ApiError(
                400, "tool_choice: only allowed when tools are given", param="tool_choice"
            )
        return None
    for i, tool in enumerate(req.tools):
        if tool.type not in (None, "custom"):
            raise ApiError(
                400,
                f"tools.{i}.type: server tools ({tool.type!r}) are not supported; give a "
                "function with name and input_schema",
                param=f"tools.{i}.type",
            )
    functions = tuple(
        check_function(t.name, t.description, t.input_schema, f"tools.{i}")
        for i, t in enumerate(req.tools)
    )
    names = check_unique(functions, "tools.{i}.name")
    kind = choice.type if choice is not None else "auto"
    forced = choice.name if choice is not None and kind == "tool" else None
    if kind == "tool" and forced not in names:
        raise unknown_choice(str(forced), names, "tool_choice.name")
    parallel = not (choice is not None and choice.disable_parallel_tool_use)
    return ToolPlan(functions, _CHOICES[kind], forced, parallel)


def message_params(
    req: MessagesRequest,
    grammar: str | None,
    keep_special_tokens: bool,
    defaults: GenerationDefaults | None,
) -> SamplingParams:
    for field in ("mcp_servers", "container"):
        if getattr(req, field) is not None:
            raise ApiError(400, f"{field}: not supported by this server", param=field)
    return build_params(
        API_FIELDS,
        max_tokens=req.max_tokens,
        defaults=defaults,
        temperature=req.temperature,
        top_p=req.top_p,
        top_k=req.top_k,
        stop=tuple(req.stop_sequences) if req.stop_sequences else None,
        skip_special_tokens=False if keep_special_tokens else None,
        structured_output=StructuredOutput("grammar", grammar) if grammar else None,
        streamed=bool(req.stream),
    )
