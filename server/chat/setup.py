"""What the chat route knows of a model's chat format, fixed once the model is loaded.

Contract: `chat_setup(tokenizer, settings)` returns a ChatSetup: the tool-call parser (the
`--tool-call-parser` flag, or the format the chat template teaches), whether the template
renders `tools` itself (else server/chat/tool_calls/prompt.py's fallback prompt is used), and whether
outputs are split into reasoning (`--reasoning-parser`: think / none, or auto: when the
template uses `<think>`; think_inside: every answer starts inside the reasoning, as Qwen3 and
DeepSeek-R1 models that write no opening `<think>` do). A tokenizer without a chat template
gets the defaults. `harmony`: the vocabulary has harmony's special tokens (gpt-oss), so prompts
are rendered and outputs read in that format (server/chat/harmony), whatever the flags say.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from server.chat.harmony import HARMONY_MARKERS
from server.chat.reasoning import uses_reasoning
from server.chat.tool_calls import ToolParser, detect_parser, make_parser
from server.settings import Settings


@dataclass(frozen=True)
class ChatSetup:
    parser: ToolParser
    takes_tools: bool
    reasoning: bool
    reasoning_inside: bool = False  # answers open inside the reasoning, without <think>
    harmony: bool = False  # gpt-oss's harmony format: server/chat/harmony


def chat_setup(tokenizer: Any, settings: Settings) -> ChatSetup:
    template = getattr(tokenizer, "chat_template", None)
    source = template.source if template is not None else None
    name = settings.tool_call_parser
    if name == "auto":
        name = detect_parser(source)
    parser = make_parser(name, _marker_ids(tokenizer, make_parser(name).markers), source)
    inside = settings.reasoning_parser == "think_inside"
    reasoning = (
        settings.reasoning_parser == "think"
        or inside
        or (settings.reasoning_parser == "auto" and uses_reasoning(source))
    )
    takes_tools = template is not None and template.uses("tools")
    harmony = len(_marker_ids(tokenizer, HARMONY_MARKERS)) == len(HARMONY_MARKERS)
    return ChatSetup(parser, takes_tools, reasoning, inside, harmony)


def _marker_ids(tokenizer: Any, markers: tuple[str, ...]) -> dict[str, int]:
    """Markers that are one special token of this vocabulary, by id."""
    ids: dict[str, int] = {}
    if tokenizer is None:
        return ids
    for marker in markers:
        encoded = tokenizer.encode(marker)
        if len(encoded) == 1 and tokenizer.is_special(encoded[0]):
            ids[marker] = encoded[0]
    return ids
