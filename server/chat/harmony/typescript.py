"""A request's functions written as harmony's TypeScript-like `functions` namespace.

Contract: `functions_namespace(functions) -> str` is `namespace functions { ... } // namespace
functions`, one `type NAME = (_: { ... }) => any;` per function (`() => any` without
properties) behind its `// description`; each property on its own line behind its
description, `name?:` unless required, its type in TypeScript (string / number / boolean,
enums as unions of literals, arrays as `T[]`, nested objects inline, anyOf / oneOf / type lists
as unions) and `// default: X` after it when the schema gives one.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from server.chat.tool_calls.base import FunctionSpec

_SCALARS = {"string": "string", "number": "number", "integer": "number", "boolean": "boolean",
            "null": "null"}  # fmt: skip


def functions_namespace(functions: Sequence[FunctionSpec]) -> str:
    lines = ["namespace functions {", ""]
    for f in functions:
        if f.description:
            lines.append(f"// {f.description}")
        props = f.parameters.get("properties") or {}
        if props:
            lines.append(f"type {f.name} = (_: {{")
            lines += _properties(f.parameters)
            lines.append("}) => any;")
        else:
            lines.append(f"type {f.name} = () => any;")
        lines.append("")
    lines.append("} // namespace functions")
    return "\n".join(lines)


def _properties(schema: dict[str, Any]) -> list[str]:
    required = set(schema.get("required") or ())
    lines: list[str] = []
    for name, prop in (schema.get("properties") or {}).items():
        if prop.get("description"):
            lines.append(f"// {prop['description']}")
        line = f"{name}{'' if name in required else '?'}: {_type(prop)},"
        if "default" in prop:
            line += f" // default: {json.dumps(prop['default'])}"
        lines.append(line)
    return lines


def _type(schema: dict[str, Any]) -> str:
    if "enum" in schema:
        return " | ".join(json.dumps(v) for v in schema["enum"])
    for union in ("anyOf", "oneOf"):
        if union in schema:
            return " | ".join(_type(s) for s in schema[union])
    kind = schema.get("type")
    if isinstance(kind, list):
        return " | ".join(_type({**schema, "type": k}) for k in kind)
    if kind == "array":
        return f"{_type(schema.get('items') or {})}[]"
    if kind == "object":
        if not schema.get("properties"):
            return "object"
        return "{\n" + "\n".join(_properties(schema)) + "\n}"
    return _SCALARS.get(kind, "any")
