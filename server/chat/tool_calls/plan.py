"""ToolPlan: a request's functions and how the model may use them, whatever API they came in.

Contract: each API checks its own request shape (server/openai/tool_request.py, ...) and builds a
ToolPlan: the functions (checked `FunctionSpec`s), the choice ("auto", "none", "required", or
"function" naming `forced`) and whether several calls may come at once. `parses_calls`: calls
are read from the output and the tools shown to the model; `enforced`: the functions a grammar
must hold the output to (server/chat/tool_calls/enforce.py), None when the model answers freely.
`check_function(name, parameters, where)` is the rule every API applies to one function (a
400 naming `where`.name or `where`.parameters, the API's own field path). `unknown_choice(name,
names, param)`: the 400 for a forced name that is no tool's, its size bounded (a request with
1000 tools gets a few names, not all: the message stays under ~1 KB).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from server.chat.tool_calls.base import FunctionSpec
from server.errors import ApiError

_NAME = re.compile(r"^[A-Za-z0-9_-]{1,64}$")


@dataclass(frozen=True)
class ToolPlan:
    functions: tuple[FunctionSpec, ...]
    choice: str  # "auto" | "none" | "required" | "function" (then `forced` names it)
    forced: str | None = None
    parallel: bool = True

    @property
    def parses_calls(self) -> bool:
        """Tool calls are read from the output (and the tools shown to the model)."""
        return self.choice != "none"

    @property
    def enforced(self) -> tuple[FunctionSpec, ...] | None:
        if self.choice == "required":
            return self.functions
        if self.choice == "function":
            return tuple(f for f in self.functions if f.name == self.forced)
        return None

    @property
    def enforced_parallel(self) -> bool:
        return self.parallel and self.choice == "required"


def check_function(
    name: str, description: str | None, parameters: dict[str, Any] | None, where: str
) -> FunctionSpec:
    """One function, checked: a 1-64 character name of letters, digits, '_' or '-', and
    parameters (default: any object) that describe an object."""
    if not _NAME.match(name):
        raise ApiError(
            400,
            f"function name {name!r} must be 1 to 64 letters, digits, '_' or '-'",
            param=f"{where}.name",
        )
    parameters = parameters if parameters is not None else {"type": "object"}
    kind = parameters.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise ApiError(
            400,
            f"the parameters of {name!r} must be a JSON Schema of an object "
            f'(type "object"), got type {kind!r}',
            param=f"{where}.parameters",
        )
    return FunctionSpec(name, description, parameters)


def check_unique(functions: tuple[FunctionSpec, ...], where: str) -> set[str]:
    """The function names, each once; a repeated one is a 400 naming `where`.{i}.name."""
    seen: set[str] = set()
    for i, function in enumerate(functions):
        if function.name in seen:
            raise ApiError(
                400,
                f"two tools are named {function.name!r}; function names must be unique",
                param=where.format(i=i),
            )
        seen.add(function.name)
    return seen


NAMES_SHOWN = 8


def unknown_choice(name: str, names: set[str], param: str) -> ApiError:
    shown = ", ".join(sorted(names)[:NAMES_SHOWN])
    if len(names) > NAMES_SHOWN:
        shown += f", ... ({len(names)} in all)"
    given = name if len(name) <= 80 else name[:80] + "..."
    return ApiError(400, f"{param}: {given!r} is not among the tools ({shown})", param=param)
