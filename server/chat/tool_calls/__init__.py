"""Tool calling on /v1/chat/completions: output parsers, one per format, and their registry.

Contract: `PARSERS` maps a `--tool-call-parser` name to its parser class; `detect_parser(template)`
names the format a chat template teaches its model (hermes when the template says nothing, since
the fallback prompt for templates without tools is Hermes-style); `make_parser(name, marker_ids,
template)` builds one (`marker_ids`: special-token text -> id, for grammars that must name a
special token; `template`: the chat template's text, for formats with more than one form).
"""

from __future__ import annotations

from collections.abc import Mapping

from server.chat.tool_calls.base import FunctionSpec, ToolParser, ToolStream
from server.chat.tool_calls.deepseek_v3 import DeepSeekV3Parser
from server.chat.tool_calls.events import (
    ArgumentsDelta,
    CallStarted,
    ContentDelta,
    ParsedOutput,
    ToolCall,
    ToolEvent,
    fold_events,
)
from server.chat.tool_calls.hermes import HermesParser
from server.chat.tool_calls.llama3_json import Llama3JsonParser
from server.chat.tool_calls.mistral import MistralParser
from server.chat.tool_calls.mistral_named import ARGS
from server.chat.tool_calls.pythonic import PythonicParser
from server.chat.tool_calls.qwen3_xml import Qwen3XmlParser

PARSERS: dict[str, type[ToolParser]] = {
    HermesParser.name: HermesParser,
    Llama3JsonParser.name: Llama3JsonParser,
    MistralParser.name: MistralParser,
    Qwen3XmlParser.name: Qwen3XmlParser,
    PythonicParser.name: PythonicParser,
    DeepSeekV3Parser.name: DeepSeekV3Parser,
}

# What a template's text shows of the format it teaches, most specific first.
_TEMPLATE_MARKS: tuple[tuple[str, str], ...] = (
    ("<function=", Qwen3XmlParser.name),  # Qwen3-Coder's template shows <tool_call> too
    ("tool▁calls▁begin", DeepSeekV3Parser.name),
    ("[func_name1(", PythonicParser.name),  # Llama 3.2 pythonic / Llama 4 templates
    ("[TOOL_CALLS]", MistralParser.name),
    ("<tool_call>", HermesParser.name),
    ("<|python_tag|>", Llama3JsonParser.name),
    ('"parameters": ', Llama3JsonParser.name),
)


def detect_parser(template: str | None) -> str:
    for mark, name in _TEMPLATE_MARKS:
        if template and mark in template:
            return name
    return HermesParser.name


def make_parser(
    name: str, marker_ids: Mapping[str, int] | None = None, template: str | None = None
) -> ToolParser:
    if name not in PARSERS:
        raise ValueError(f"unknown tool-call parser {name!r}; choose one of {', '.join(PARSERS)}")
    if name == MistralParser.name:  # the template shows which of its forms the model writes
        return MistralParser(marker_ids, named=template is not None and ARGS in template)
    if name == DeepSeekV3Parser.name:  # V3 / R1 fence the arguments, V3.1 does not
        return DeepSeekV3Parser(marker_ids, fenced=template is None or "```json" in template)
    return PARSERS[name]()


__all__ = [
    "PARSERS",
    "ArgumentsDelta",
    "CallStarted",
    "ContentDelta",
    "FunctionSpec",
    "ParsedOutput",
    "ToolCall",
    "ToolEvent",
    "ToolParser",
    "ToolStream",
    "detect_parser",
    "fold_events",
    "make_parser",
]
