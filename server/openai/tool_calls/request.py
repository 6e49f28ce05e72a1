"""A chat request's `tools`, `tool_choice` and `parallel_tool_calls`, checked: a ToolPlan.

Contract: `tool_plan(req)` returns None when the request has no tools, else a ToolPlan; every
invalid combination is an `ApiError(400)` whose `param` names the field (`tools.0.function.name`,
`tool_choice`, ...): an empty tools list, a function name that is not 1-64 letters, digits, `_`
or `-`, two functions with one name, parameters that do not describe an object, a tool_choice
without tools, a named tool_choice that names no tool. `tool_choice` defaults to "auto".
`ToolPlan.enforced` is the functions a grammar must hold the output to (`required`: any of them,
a named choice: that one), or None when the model may answer freely.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from server.errors import ApiError
from server.openai.protocol import ChatCompletionRequest, NamedToolChoice
from server.openai.tool_calls.base import FunctionSpec

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


def tool_plan(req: ChatCompletionRequest) -> ToolPlan | None:
    if req.tools is None:
        if req.tool_choice is not None:
            raise ApiError(
                400, "tool_choice is only allowed when tools are given", param="tool_choice"
            )
        return None
    if not req.tools:
        raise ApiError(400, "tools must list at least one function", param="tools")
    functions = tuple(_function(i, tool) for i, tool in enumerate(req.tools))
    seen: set[str] = set()
    for i, function in enumerate(functions):
        if function.name in seen:
            raise ApiError(
                400,
                f"two tools are named {function.name!r}; function names must be unique",
                param=f"tools.{i}.function.name",
            )
        seen.add(function.name)
    choice = req.tool_choice or "auto"
    parallel = req.parallel_tool_calls is not False
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in seen:
            raise ApiError(
                400,
                f"tool_choice names the function {name!r}, which is not among the tools "
                f"({', '.join(sorted(seen))})",
                param="tool_choice",
            )
        return ToolPlan(functions, "function", name, parallel)
    return ToolPlan(functions, choice, None, parallel)


def _function(index: int, tool: object) -> FunctionSpec:
    function = tool.function  # type: ignore[attr-defined]
    where = f"tools.{index}.function"
    if not _NAME.match(function.name):
        raise ApiError(
            400,
            f"function name {function.name!r} must be 1 to 64 letters, digits, '_' or '-'",
            param=f"{where}.name",
        )
    parameters = function.parameters if function.parameters is not None else {"type": "object"}
    kind = parameters.get("type", "object")
    if kind != "object" and not (isinstance(kind, list) and "object" in kind):
        raise ApiError(
            400,
            f"the parameters of {function.name!r} must be a JSON Schema of an object "
            f'(type "object"), got type {kind!r}',
            param=f"{where}.parameters",
        )
    return FunctionSpec(function.name, function.description, parameters)
