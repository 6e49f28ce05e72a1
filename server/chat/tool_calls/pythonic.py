"""Llama 3.2+ / Llama 4 pythonic tool calls: the whole answer is a Python list of calls.

    [get_weather(city="Paris", unit="celsius"), get_time(zone="CET")]

Contract (server/chat/tool_calls/base.py): an answer is calls when, without the whitespace
around it, it is a list literal of calls to plain names with keyword arguments only, each value
a literal (strings, numbers, True / False / None and JSON's true / false / null, lists, dicts);
the arguments are those keywords as a JSON object, in the order written. Any other answer is
content as it is. `stream()` shows an answer that does not open with `[` as it comes and holds
one that does until the end (only then is it known to be calls); its events fold to `parse`.
`render_calls` writes Python literals; `grammar()` writes the chosen function's required
arguments in schema order with JSON values (read back, as above).
"""

from __future__ import annotations

import ast
import json
from collections.abc import Sequence
from typing import Any

from server.chat.tool_calls.base import FunctionSpec, ToolParser, ToolStream, calls_rule
from server.chat.tool_calls.events import (
    ArgumentsDelta,
    CallStarted,
    ContentDelta,
    ParsedOutput,
    ToolCall,
    ToolEvent,
)
from server.chat.tool_calls.holdback import WHITESPACE

_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}
_JSON_NAMES = {"true": True, "false": False, "null": None}


class PythonicParser(ToolParser):
    name = "pythonic"

    def parse(self, text: str) -> ParsedOutput:
        calls = read_calls(text)
        return ParsedOutput("", calls) if calls else ParsedOutput(text)

    def stream(self) -> ToolStream:
        return _PythonicStream()

    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        def one(call: ToolCall) -> str:
            try:
                arguments = json.loads(call.arguments)
            except json.JSONDecodeError:
                arguments = {}
            pairs = arguments.items() if isinstance(arguments, dict) else ()
            return f"{call.name}(" + ", ".join(f"{k}={_python(v)}" for k, v in pairs) + ")"

        return "[" + ", ".join(one(c) for c in calls) + "]"

    def grammar(self, tools: Sequence[FunctionSpec], parallel: bool) -> str:
        rules = ['start: "[" calls "]"', calls_rule(parallel, '", "').replace("start:", "calls:")]
        rules.append("call: " + " | ".join(f"f{i}" for i in range(len(tools))))
        for i, tool in enumerate(tools):
            props = tool.parameters.get("properties", {})
            required = [k for k in props if k in tool.parameters.get("required", ())]
            args = ' ", " '.join(f"f{i}a{j}" for j in range(len(required)))
            rules.append(f'f{i}: {json.dumps(tool.name + "(")} {args} ")"')
            for j, key in enumerate(required):
                value = json.dumps({**props[key], "x-guidance": _COMPACT})
                rules.append(f"f{i}a{j}: {json.dumps(key + '=')} f{i}v{j}")
                rules.append(f"f{i}v{j}: %json {value}")
        return "\n".join(rules) + "\n"


def read_calls(text: str) -> tuple[ToolCall, ...]:
    """The calls `text` is, or () when it is not a list of calls."""
    source = text.strip(WHITESPACE)
    if not (source.startswith("[") and source.endswith("]")):
        return ()
    try:
        tree = ast.parse(source, mode="eval").body
    except (SyntaxError, ValueError, RecursionError):
        return ()
    if not isinstance(tree, ast.List) or not tree.elts:
        return ()
    calls = []
    for node in tree.elts:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)) or node.args:
            return ()
        try:
            arguments = {kw.arg: _literal(kw.value) for kw in node.keywords}
        except ValueError:
            return ()
        if None in arguments:  # **kwargs
            return ()
        calls.append(ToolCall(node.func.id, json.dumps(arguments, ensure_ascii=False)))
    return tuple(calls)


def _literal(node: ast.AST) -> Any:
    if isinstance(node, ast.Name) and node.id in _JSON_NAMES:
        return _JSON_NAMES[node.id]
    if isinstance(node, ast.List):
        return [_literal(n) for n in node.elts]
    if isinstance(node, ast.Dict):
        if any(k is None for k in node.keys):
            raise ValueError("** in a dict")
        return {_key(k): _literal(v) for k, v in zip(node.keys, node.values, strict=True)}
    value = ast.literal_eval(node)  # ValueError unless a literal
    if not isinstance(value, str | int | float | bool | type(None)):
        raise ValueError("not a JSON value")
    return value


def _key(node: ast.AST | None) -> str:
    key = _literal(node)
    if not isinstance(key, str):
        raise ValueError("a dict key that is not a string")
    return key


def _python(value: Any) -> str:
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_python(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)}: {_python(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


class _PythonicStream(ToolStream):
    def __init__(self) -> None:
        self._held = ""
        self._mode = "lead"  # lead (only whitespace so far) | text | list (held to the end)

    def feed(self, text: str) -> list[ToolEvent]:
        if self._mode == "text":
            return [ContentDelta(text)] if text else []
        self._held += text
        head = self._held.lstrip(WHITESPACE)
        if self._mode == "lead" and head:
            self._mode = "list" if head.startswith("[") else "text"
        if self._mode == "text":
            out, self._held = self._held, ""
            return [ContentDelta(out)]
        return []

    def finish(self) -> list[ToolEvent]:
        held, self._held = self._held, ""
        calls = read_calls(held) if self._mode == "list" else ()
        if not calls:
            return [ContentDelta(held)] if held else []
        events: list[ToolEvent] = []
        for k, call in enumerate(calls):
            events += [CallStarted(k, call.name), ArgumentsDelta(k, call.arguments)]
        return events
