"""A chat request's `tools`, `tool_choice` and `parallel_tool_calls`, checked: a ToolPlan.

Contract: `tool_plan(req)` returns None when the request has no tools, else a ToolPlan; every
invalid combination is an `ApiError(400)` whose `param` names the field (`tools.0.function.name`,
`tool_choice`, ...): an empty tools list, a function name that is not 1-64 letters, digits, `_`
or `-`, two functions with one name, parameters that do not describe an object, a tool_choice
without tools, a named tool_choice that names no tool. `tool_choice` defaults to "auto". ToolPlan and the rules every API shares:
server/chat/tool_calls/plan.py.
"""

from __future__ import annotations

from server.chat.tool_calls.base import FunctionSpec
from server.chat.tool_calls.plan import ToolPlan, check_function, check_unique, unknown_choice
from server.errors import ApiError
from server.openai.protocol import ChatCompletionRequest, NamedToolChoice


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
    seen = check_unique(functions, "tools.{i}.function.name")
    choice = req.tool_choice or "auto"
    parallel = req.parallel_tool_calls is not False
    if isinstance(choice, NamedToolChoice):
        name = choice.function.name
        if name not in seen:
            raise unknown_choice(name, seen, "tool_choice")
        return ToolPlan(functions, "function", name, parallel)
    return ToolPlan(functions, choice, None, parallel)


def _function(index: int, tool: object) -> FunctionSpec:
    function = tool.function  # type: ignore[attr-defined]
    where = f"tools.{index}.function"
    return check_function(function.name, function.description, function.parameters, where)
