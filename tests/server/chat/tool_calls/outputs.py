"""Hypothesis strategies for model outputs with tool calls, shared by the parser tests.

`calls()` draws calls with random JSON arguments (written compactly or spaced, as models do);
`fragment_text(parser)` draws text built from the pieces a format is made of (tags, braces,
quotes, keys, separators), so malformed and cut-off outputs are drawn as often as clean ones.
`parser_for(variant)`: the parser of each variant the tests cover: every registered parser, and
Mistral's named form (`[TOOL_CALLS]name[ARGS]{...}`) as a template that writes it selects.
"""

from __future__ import annotations

import json

from hypothesis import strategies as st

from server.chat.tool_calls import PARSERS, ToolCall, ToolParser, make_parser

# The line of a v11+ Mistral template that writes a call (only "[ARGS]" in it matters).
NAMED_TEMPLATE = "{{- '[TOOL_CALLS]' + tool.function.name + '[ARGS]' + arguments }}"
# The formats whose calls are JSON objects (the shared parser tests); the others (XML, pythonic,
# DeepSeek's tokens) have their own tests, tests/server/chat/tool_calls/test_block_formats.py.
VARIANTS = ["hermes", "llama3_json", "mistral", "mistral_named"]
OTHER_FORMATS = sorted(set(PARSERS) - set(VARIANTS))


def parser_for(variant: str) -> ToolParser:
    if variant == "mistral_named":
        return make_parser("mistral", template=NAMED_TEMPLATE)
    return make_parser(variant)


NAMES = st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,8}", fullmatch=True)
KEYS = st.text(alphabet='abcxyz_ "\\}{é', min_size=1, max_size=5)
SCALARS = st.none() | st.booleans() | st.integers(-1000, 1000) | st.text(max_size=6)
JSON_VALUES = st.recursive(
    SCALARS,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=3),
    max_leaves=6,
)
ARGUMENTS = st.dictionaries(KEYS, JSON_VALUES, max_size=4)
SEPARATORS = st.sampled_from([(",", ":"), (", ", ": "), (" , ", " : ")])


@st.composite
def calls(draw: st.DrawFn, min_size: int = 1, max_size: int = 3) -> list[tuple[ToolCall, dict]]:
    """(call, the arguments it encodes) pairs."""
    out = []
    for _ in range(draw(st.integers(min_size, max_size))):
        args = draw(ARGUMENTS)
        text = json.dumps(args, separators=draw(SEPARATORS), ensure_ascii=draw(st.booleans()))
        out.append((ToolCall(draw(NAMES), text), args))
    return out


COMMON_PIECES = ["{", "}", '"', "\\", ":", ",", " ", "\n", "x", "é", '"name"', '"f"']
COMMON_PIECES += ['"arguments"', '"parameters"', '{"a": 1}', "[", "]", ";"]
PIECES = {
    "hermes": ["<tool_call>", "</tool_call>", "<tool_", "</tool"],
    "llama3_json": ["<|python_tag|>", "<|python"],
    "mistral": ["[TOOL_CALLS]", "[TOOL_"],
    "mistral_named": ["[TOOL_CALLS]", "[TOOL_", "[ARGS]", "[AR", "[CALL_ID]", "a1", "f"],
}


def fragment_text(parser_name: str) -> st.SearchStrategy[str]:
    pieces = st.sampled_from(COMMON_PIECES + PIECES[parser_name] * 3)
    return st.lists(pieces, max_size=25).map("".join)


PROSE = st.text(alphabet="ab .,\n\t{}", max_size=12)


def split_at(text: str, cuts: list[int]) -> list[str]:
    """`text` cut at the drawn points (taken modulo its length), in order."""
    bounds = sorted({0, len(text), *(c % (len(text) + 1) for c in cuts)})
    return [text[a:b] for a, b in zip(bounds, bounds[1:], strict=False)]
