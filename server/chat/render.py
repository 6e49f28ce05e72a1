"""A conversation through the loaded model's chat template: the prompt every chat-style API sends.

Contract: `ChatRenderer(state)` knows the loaded model's chat format (`setup`: server/chat/setup.py,
read once per tokenizer). `render(messages, add_generation_prompt, plan, param, reasoning_effort)`
renders OpenAI chat message dicts (and the plan's tools; see server/chat/tool_calls/prompt.py)
with the template (a harmony model's: server/chat/harmony, with its reasoning effort) and
tokenizes the text, both off the event loop, returning a `RenderedPrompt`; a
template's refusal (no template, roles out of order) is a 400 naming `param`, the API's field.
`output_format(plan, prompt_text, reasoning_asked)` says how to read the answer (reasoning split, call parser:
server/chat/output.py) and the grammar the plan's tool choice holds the output to, if any.
"""

from __future__ import annotations

import asyncio
import datetime
from dataclasses import dataclass
from functools import partial
from typing import Any

from server.chat.harmony import HarmonyOutputFormat, render_harmony
from server.chat.output import ChatOutputFormat
from server.chat.reasoning import ReasoningParser, prompt_opens_reasoning
from server.chat.setup import ChatSetup, chat_setup
from server.chat.tool_calls.enforce import tool_grammar
from server.chat.tool_calls.plan import ToolPlan
from server.chat.tool_calls.prompt import template_inputs
from server.errors import ApiError
from server.state import ServerState


@dataclass(frozen=True)
class RenderedPrompt:
    token_ids: list[int]
    text: str


class ChatRenderer:
    def __init__(self, state: ServerState) -> None:
        self.state = state
        self._setup: tuple[Any, ChatSetup] | None = None  # (tokenizer, its setup)

    @property
    def setup(self) -> ChatSetup:
        """The loaded model's chat format (computed once per tokenizer)."""
        tokenizer = self.state.tokenizer
        if self._setup is None or self._setup[0] is not tokenizer:
            self._setup = (tokenizer, chat_setup(tokenizer, self.state.settings))
        return self._setup[1]

    async def render(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool,
        plan: ToolPlan | None = None,
        param: str = "messages",
        reasoning_effort: str | None = None,
    ) -> RenderedPrompt:
        tokenizer = self.state.require_tokenizer()
        if not messages:
            raise ApiError(400, f"{param} must not be empty", param=param)
        setup = self.setup
        if setup.harmony:  # gpt-oss: the harmony format, not the folder's Jinja template
            functions = plan.functions if plan is not None and plan.parses_calls else ()
            today = datetime.date.today().isoformat()
            render = partial(
                render_harmony, messages, functions, reasoning_effort, today, add_generation_prompt
            )
        else:
            dicts, extra = template_inputs(messages, plan, setup.parser, setup.takes_tools)
            render = partial(tokenizer.apply_chat_template, dicts, add_generation_prompt, **extra)
        try:
            text = await asyncio.to_thread(render)
        except ValueError as exc:  # e.g. the model has no chat template
            raise ApiError(400, str(exc), param=param) from None
        except Exception as exc:  # template errors (e.g. roles out of order) are the caller's
            raise ApiError(
                400, f"the chat template rejected these messages: {exc}", param=param
            ) from None
        return RenderedPrompt(await asyncio.to_thread(tokenizer.encode, text, False), text)

    def output_format(
        self, plan: ToolPlan | None, prompt_text: str, reasoning_asked: bool | None = None
    ) -> tuple[ChatOutputFormat, str | None]:
        """How to read the answer (reasoning, calls) and the grammar the tool choice asks for;
        `reasoning_asked` True reads `<think>` even where the model's setup would not."""
        setup = self.setup
        if setup.harmony:
            if plan is not None and plan.enforced is not None:
                raise ApiError(
                    400,
                    f"tool_choice {plan.choice!r} cannot be enforced on this model's harmony "
                    "format (gpt-oss); use auto or none",
                    param="tool_choice",
                )
            return HarmonyOutputFormat(parses_calls=plan is not None and plan.parses_calls), None
        parser = None
        if plan is not None and plan.parses_calls:
            parser = setup.parser.with_tools(plan.functions)
        reasoning, mode = None, None
        if setup.reasoning or reasoning_asked:
            inside = setup.reasoning_inside or prompt_opens_reasoning(prompt_text)
            reasoning, mode = ReasoningParser(inside), "inside" if inside else "optional"
        return ChatOutputFormat(parser, reasoning), tool_grammar(setup.parser, plan, mode)
