"""The grammar that holds an output to `tool_choice` ("required" or a named function).

Contract: `tool_grammar(parser, plan, reasoning)` is None when the model may answer freely, else
a Lark grammar (llguidance's dialect) whose every sentence `parser` reads as one call (several
when `parallel_tool_calls` allows and the choice is "required") to the allowed functions, with
arguments valid against their schemas. `reasoning` lets a reasoning model think first:
"inside" (the prompt opened `<think>`: the output starts with the reasoning and its `</think>`),
"optional" (the output may open with a `<think>...</think>` block), None (no reasoning).
"""

from __future__ import annotations

from typing import Literal

from server.chat.tool_calls.base import ToolParser
from server.chat.tool_calls.plan import ToolPlan

Reasoning = Literal["inside", "optional"] | None

_THINK = r"think_text[lazy]: /(.|\n)*<\/think>/"


def tool_grammar(parser: ToolParser, plan: ToolPlan | None, reasoning: Reasoning) -> str | None:
    if plan is None or plan.enforced is None:
        return None
    grammar = parser.grammar(plan.enforced, plan.enforced_parallel)
    if reasoning is None:
        return grammar
    grammar = grammar.replace("start:", "answer:", 1)
    if reasoning == "inside":
        return f'start: think_text "\\n\\n" answer\n{_THINK}\n{grammar}'
    return f'start: ("<think>" think_text "\\n\\n")? answer\n{_THINK}\n{grammar}'
