"""Qwen3-Coder tool calls: XML-like blocks, one call each.

    <tool_call>
    <function=get_weather>
    <parameter=city>
    Paris
    </parameter>
    </function>
    </tool_call>

Contract (server/chat/tool_calls/tagged.py): a block is a call when its body is exactly one
`<function=NAME>` element (whitespace around it) holding only `<parameter=KEY>VALUE</parameter>`
elements; else it is content. A value loses one newline on each side (as the format writes
it); it stays text when the function's schema (`with_tools`) types that property "string", or
when it is not JSON; otherwise it is read as JSON (numbers, booleans, objects, arrays, null).
The arguments are a JSON object of the parameters in the order written. `grammar()` writes the
required parameters of the chosen function in schema order: string values as text without `<`,
the others as JSON valid for their schema.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from server.chat.tool_calls.base import FunctionSpec, calls_rule
from server.chat.tool_calls.events import ToolCall
from server.chat.tool_calls.tagged import TaggedBlockParser

_FUNCTION = re.compile(r"\s*<function=([^>\n]+)>(.*?)</function>\s*", re.DOTALL)
_PARAMETER = re.compile(r"\s*<parameter=([^>\n]+)>(.*?)</parameter>\s*", re.DOTALL)
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class Qwen3XmlParser(TaggedBlockParser):
    name = "qwen3_xml"
    open_tag, close_tag = "<tool_call>", "</tool_call>"

    def read_block(self, body: str) -> tuple[ToolCall, ...] | None:
        function = _FUNCTION.fullmatch(body)
        if function is None:
            return None
        name, inner = function.group(1), function.group(2)
        properties = self.schemas.get(name, {}).get("properties", {})
        arguments: dict[str, Any] = {}
        at = 0
        while at < len(inner):
            parameter = _PARAMETER.match(inner, at)
            if parameter is None:
                if inner[at:].strip():
                    return None  # text that is no parameter: not a call
                break
            key, value = parameter.group(1), _unwrap(parameter.group(2))
            arguments[key] = _typed(value, properties.get(key))
            at = parameter.end()
        return (ToolCall(name, json.dumps(arguments, ensure_ascii=False)),)

    def render_calls(self, calls: Sequence[ToolCall]) -> str:
        blocks = []
        for call in calls:
            try:
                arguments = json.loads(call.arguments)
            except json.JSONDecodeError:
                arguments = {}
            params = "".join(
                f"<parameter={key}>\n{_written(value)}\n</parameter>\n"
                for key, value in (arguments.items() if isinstance(arguments, dict) else ())
            )
            blocks.append(f"<tool_call>\n<function={call.name}>\n{params}</function>\n</tool_call>")
        return "\n".join(blocks)

    def grammar(self, tools: Sequence[FunctionSpec], parallel: bool) -> str:
        rules = [calls_rule(parallel, r'"\n"'), 'call: "<tool_call>\\n" function "</tool_call>"']
        rules.append("function: " + " | ".join(f"f{i}" for i in range(len(tools))))
        for i, tool in enumerate(tools):
            props = tool.parameters.get("properties", {})
            required = [k for k in props if k in tool.parameters.get("required", ())]
            params = " ".join(f"f{i}p{j}" for j in range(len(required)))
            head = json.dumps(f"<function={tool.name}>\n")
            rules.append(f'f{i}: {head} {params} "</function>\\n"')
            for j, key in enumerate(required):
                open_ = json.dumps(f"<parameter={key}>\n")
                schema = props[key]
                if isinstance(schema, dict) and schema.get("type") == "string" and len(schema) == 1:
                    # one terminal with its close tag: the value's own newlines stay in it
                    rules.append(f"f{i}p{j}: {open_} /[^<]*\\n<\\/parameter>\\n/")
                    continue
                rules.append(f'f{i}p{j}: {open_} f{i}v{j} "\\n</parameter>\\n"')
                value = json.dumps({**schema, "x-guidance": _COMPACT})
                rules.append(f"f{i}v{j}: %json {value}")
        return "\n".join(rules) + "\n"


def _unwrap(value: str) -> str:
    value = value.removeprefix("\n")
    return value.removesuffix("\n")


def _typed(value: str, schema: Any) -> Any:
    if isinstance(schema, dict) and schema.get("type") == "string":
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


def _written(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
