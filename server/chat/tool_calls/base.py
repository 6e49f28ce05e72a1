"""The shape every tool-call format shares: a parser, its stream, and what they build on.

Contract: a `ToolParser` knows one output format. `parse(text)` reads a whole output;
`stream()` gives a `ToolStream` whose `feed(delta)` / `finish()` events fold (events.fold_events)
to exactly `parse` of the concatenated deltas, however the text was split. `grammar(tools,
parallel)` is a Lark grammar (llguidance's dialect) that only lets the model write calls to the
given functions in this format, their arguments valid against each function's JSON schema (an
arguments object declaring `properties` gets no others unless its schema asks for them): one
call, or one or more when `parallel`. `markers` are the special tokens the format writes, which
the output text must keep (the request then decodes with skip_special_tokens off).
"""

from __future__ import annotations

import json
from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from server.chat.tool_calls.events import ParsedOutput, ToolCall, ToolEvent, fold_events
from server.chat.tool_calls.holdback import WHITESPACE
from server.chat.tool_calls.json_scan import CallScanner

# Compact JSON in enforced calls: "key": value, items ", " (no free whitespace for a small
# model to loop in).
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class FunctionSpec:
    """One entry of a request's `tools`, checked (each API: server/chat/tool_calls/plan.py)."""

    name: str
    description: str | None = None
    parameters: dict[str, Any] = field(default_factory=lambda: {"type": "object"})


class ToolStream(ABC):
    @abstractmethod
    def feed(self, text: str) -> list[ToolEvent]: ...

    @abstractmethod
    def finish(self) -> list[ToolEvent]: ...


class ToolParser(ABC):
    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]] = ()

    def with_tools(self, functions: Sequence[FunctionSpec]) -> ToolParser:
        """This parser for a request with these functions (formats that type values by the
        schemas override it)."""
        return self

    @abstractmethod
    def parse(self, text: str) -> ParsedOutput: ...

    @abstractmethod
    def stream(self) -> ToolStream: ...

    @abstractmethod
    def grammar(self, tools: Sequence[FunctionSpec], parallel: bool) -> str: ...

    @abstractmethod
    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        """Calls written the way the model writes them (for histories and prompts)."""


def call_object(call: ToolCall, args_key: str = "arguments") -> str:
    """`{"name": ..., "<args_key>": <arguments>}` with the arguments' JSON text as it is."""
    name = json.dumps(call.name, ensure_ascii=False)
    return f'{{"name": {name}, "{args_key}": {call.arguments}}}'


def scan_whole(body: str) -> ToolCall | None:
    """The call a complete body holds, or None when it is not a call."""
    scanner = CallScanner()
    scanner.feed(body)
    scanner.finish()
    if not scanner.is_call:
        return None
    return fold_events(scanner.take(0)).calls[0]


def assemble(pieces: list[tuple[str, Any]]) -> ParsedOutput:
    """Content and calls from ("text", str) / ("call", ToolCall) pieces in output order; text
    next to a call loses the whitespace that touches the call."""
    merged: list[tuple[str, Any]] = []
    for kind, value in pieces:
        if kind == "text" and merged and merged[-1][0] == "text":
            merged[-1] = ("text", merged[-1][1] + value)
        else:
            merged.append((kind, value))
    content: list[str] = []
    for i, (kind, value) in enumerate(merged):
        if kind != "text":
            continue
        if i > 0:
            value = value.lstrip(WHITESPACE)
        if i + 1 < len(merged):
            value = value.rstrip(WHITESPACE)
        content.append(value)
    calls = tuple(value for kind, value in merged if kind == "call")
    return ParsedOutput("".join(content), calls)


def calls_rule(parallel: bool, separator: str) -> str:
    """`start` of a grammar: one `call`, or calls joined by `separator` (a Lark literal)."""
    return f"start: call ({separator} call)*" if parallel else "start: call"


def call_json(
    tools: Sequence[FunctionSpec], name_key: str = "name", args_key: str = "arguments"
) -> str:
    """`%json {...}`: an object naming one of `tools` and holding arguments valid for it."""
    defs: dict[str, Any] = {}
    options = []
    for i, tool in enumerate(tools):
        params = _closed(_hoist_defs(tool.parameters, f"t{i}_", defs))
        options.append(
            {
                "type": "object",
                "properties": {name_key: {"const": tool.name}, args_key: params},
                "required": [name_key, args_key],
                "additionalProperties": False,
            }
        )
    schema: dict[str, Any] = options[0] if len(options) == 1 else {"anyOf": options}
    schema = {**schema, "x-guidance": _COMPACT}
    if defs:
        schema["$defs"] = defs
    return "%json " + json.dumps(schema, ensure_ascii=False)


def args_json(tool: FunctionSpec) -> str:
    """`%json {...}`: arguments valid for `tool`, alone (formats that name the function
    outside the JSON)."""
    schema = {**_closed(tool.parameters), "x-guidance": _COMPACT}
    return "%json " + json.dumps(schema, ensure_ascii=False)


_OPEN_ENDED = ("additionalProperties", "patternProperties", "unevaluatedProperties")
_COMPOSED = ("allOf", "anyOf", "oneOf", "not", "if", "$ref")


def _closed(schema: Any) -> Any:
    """The arguments object limited to the properties it declares, unless the schema says
    otherwise: every such object still satisfies the schema, and a small model is kept from
    inventing keys forever. Schemas built by composition are left as they are."""
    if (
        not isinstance(schema, dict)
        or "properties" not in schema
        or any(key in schema for key in _OPEN_ENDED + _COMPOSED)
    ):
        return schema
    return {**schema, "additionalProperties": False}


def _hoist_defs(schema: Any, prefix: str, defs: dict[str, Any]) -> Any:
    """A function's schema nested under the call object: its `$defs` move to the root (renamed
    with `prefix`, so two tools' definitions never clash) and its local refs follow them."""
    if not isinstance(schema, dict):
        return schema

    def rewrite(node: Any) -> Any:
        if isinstance(node, list):
            return [rewrite(n) for n in node]
        if not isinstance(node, dict):
            return node
        out = {}
        for key, value in node.items():
            if key == "$ref" and isinstance(value, str):
                for root in ("#/$defs/", "#/definitions/"):
                    if value.startswith(root):
                        value = "#/$defs/" + prefix + value[len(root) :]
                out[key] = value
            elif key in ("$defs", "definitions") and node is schema and isinstance(value, dict):
                for name, sub in value.items():
                    defs[prefix + name] = rewrite(sub)
            else:
                out[key] = rewrite(value)
        return out

    return rewrite(schema)
