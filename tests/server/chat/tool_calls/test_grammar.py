"""The grammars that enforce `tool_choice`: they accept exactly the calls the parsers read.

Enforced calls write their arguments in the order of the schema's properties (llguidance's
JSON rule), so drawn arguments are written in that order. Oracle: llguidance itself, matching bytes (a byte-level tokenizer) against each grammar; the
accepted texts are written by hand-independent code (json.dumps of drawn arguments valid for
the schema) and must parse back, through the format's own parser, to the same calls; texts that
break the schema, name another function or add a second call where one is allowed are refused.
"""

from __future__ import annotations

import json

import pytest
import tiktoken
from hypothesis import given, settings
from hypothesis import strategies as st
from llguidance import LLMatcher
from llguidance.tiktoken import lltokenizer_from_encoding

from server.chat.tool_calls import FunctionSpec, ToolCall, make_parser
from server.chat.tool_calls.enforce import tool_grammar
from server.openai.tool_request import ToolPlan
from tests.server.chat.tool_calls.outputs import VARIANTS, parser_for

_BYTES = tiktoken.Encoding(
    name="bytes",
    pat_str=r"[\s\S]",
    mergeable_ranks={bytes([i]): i for i in range(256)},
    special_tokens={"<eos>": 256},
)
TOKENIZER = lltokenizer_from_encoding(_BYTES, eos_token=256)

WEATHER = FunctionSpec(
    "get_weather",
    None,
    {
        "type": "object",
        "properties": {
            "city": {"type": "string"},
            "days": {"type": "integer", "minimum": 1, "maximum": 9},
            "unit": {"$ref": "#/$defs/unit"},
        },
        "required": ["city", "days"],
        "additionalProperties": False,
        "$defs": {"unit": {"enum": ["C", "F"]}},
    },
)
CLOCK = FunctionSpec("now", "The time", {"type": "object", "properties": {}})
NAMES = VARIANTS
WEATHER_ARGS = st.fixed_dictionaries(
    # llguidance's JSON strings take DEL (U+007F) only escaped; json.dumps writes it raw. No lone
    # surrogates (codec utf-8): the matcher is fed text.encode(), which refuses them
    {
        "city": st.text(st.characters(codec="utf-8", exclude_characters="\x7f"), max_size=8),
        "days": st.integers(1, 9),
    },
    optional={"unit": st.sampled_from(["C", "F"])},
).map(lambda a: {k: a[k] for k in ("city", "days", "unit") if k in a})  # the schema's order


def accepts(grammar: str, text: str) -> bool:
    matcher = LLMatcher(TOKENIZER, LLMatcher.grammar_from_lark(grammar))
    return matcher.consume_tokens(list(text.encode())) and matcher.is_accepting()


def calls_text(name: str, calls: list[tuple[str, dict]]) -> str:
    parser = parser_for(name)
    return parser.render_calls([ToolCall(f, json.dumps(a, ensure_ascii=False)) for f, a in calls])


@pytest.mark.parametrize("name", NAMES)
def test_grammars_compile(name):
    for plan in (
        ToolPlan((WEATHER, CLOCK), "required"),
        ToolPlan((WEATHER,), "function", "get_weather"),
    ):
        grammar = tool_grammar(parser_for(name), plan, None)
        assert LLMatcher.validate_grammar(LLMatcher.grammar_from_lark(grammar)) == ""


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=25, deadline=None)
@given(
    calls=st.lists(
        st.one_of(WEATHER_ARGS.map(lambda a: ("get_weather", a)), st.just(("now", {}))),
        min_size=1,
        max_size=3,
    )
)
def test_required_accepts_valid_calls_which_parse_back(name, calls):
    grammar = tool_grammar(parser_for(name), ToolPlan((WEATHER, CLOCK), "required"), None)
    text = calls_text(name, calls)
    assert accepts(grammar, text), text
    parsed = parser_for(name).parse(text).calls
    assert [(c.name, json.loads(c.arguments)) for c in parsed] == calls


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize(
    "calls",
    [
        [("get_weather", {"city": "Paris"})],  # a required argument missing
        [("get_weather", {"city": "Paris", "days": 0})],  # below the minimum
        [("get_weather", {"city": "Paris", "days": 2, "wind": True})],  # no such argument
        [("get_weather", {"city": "Paris", "days": 2, "unit": "K"})],  # not in the $defs enum
        [("get_time", {})],  # no such function
    ],
)
def test_required_refuses_calls_that_break_the_schemas(name, calls):
    grammar = tool_grammar(parser_for(name), ToolPlan((WEATHER, CLOCK), "required"), None)
    assert not accepts(grammar, calls_text(name, calls))


@pytest.mark.parametrize("name", NAMES)
def test_a_named_choice_allows_one_call_to_that_function_only(name):
    plan = ToolPlan((WEATHER, CLOCK), "function", "now")
    grammar = tool_grammar(parser_for(name), plan, None)
    assert accepts(grammar, calls_text(name, [("now", {})]))
    assert not accepts(grammar, calls_text(name, [("now", {}), ("now", {})]))
    assert not accepts(grammar, calls_text(name, [("get_weather", {"city": "x", "days": 1})]))
    assert not accepts(grammar, "It is noon.")


def test_parallel_tool_calls_false_allows_one_call():
    plan = ToolPlan((CLOCK,), "required", parallel=False)
    grammar = tool_grammar(make_parser("hermes"), plan, None)
    assert accepts(grammar, calls_text("hermes", [("now", {})]))
    assert not accepts(grammar, calls_text("hermes", [("now", {}), ("now", {})]))


def test_auto_and_none_are_not_enforced():
    for choice in ("auto", "none"):
        assert tool_grammar(make_parser("hermes"), ToolPlan((CLOCK,), choice), None) is None


def test_a_reasoning_model_may_think_before_the_enforced_call():
    plan = ToolPlan((CLOCK,), "required")
    call = calls_text("hermes", [("now", {})])
    inside = tool_grammar(make_parser("hermes"), plan, "inside")
    assert accepts(inside, f"Let me see.\n</think>\n\n{call}")
    assert not accepts(inside, call)
    optional = tool_grammar(make_parser("hermes"), plan, "optional")
    assert accepts(optional, call)
    assert accepts(optional, f"<think>hmm</think>\n\n{call}")


def test_enforced_arguments_keep_to_the_declared_properties_unless_the_schema_opens_them():
    open_ = FunctionSpec("f", None, {"type": "object", "properties": {"a": {"type": "integer"}}})
    extra = '{"a": 1, "b": 2}'
    grammar = tool_grammar(make_parser("hermes"), ToolPlan((open_,), "required"), None)
    assert accepts(grammar, calls_text("hermes", [("f", {"a": 1})]))
    assert not accepts(grammar, make_parser("hermes").render_calls([ToolCall("f", extra)]))
    schema = {**open_.parameters, "additionalProperties": {"type": "integer"}}
    wide = FunctionSpec("f", None, schema)
    grammar = tool_grammar(make_parser("hermes"), ToolPlan((wide,), "required"), None)
    assert accepts(grammar, make_parser("hermes").render_calls([ToolCall("f", extra)]))
