"""Tool-call parsers: a whole output parses to the calls written into it, and streaming it in
any split gives exactly the whole parse (the guarantee streamed tool calls depend on).

Oracles: calls are drawn, written in each format by hand-built strings (json.dumps of drawn
arguments, the format's tags), and must come back with arguments that json.loads to what was
drawn; the whole parse is the oracle of every streamed split (each single split point, every
character alone, and drawn partitions), on clean outputs and on drawn fragment soup.
"""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.chat.tool_calls import ArgumentsDelta, CallStarted, ToolCall, fold_events, make_parser
from server.chat.tool_calls.events import ParsedOutput
from tests.server.chat.tool_calls.outputs import (
    PROSE,
    VARIANTS,
    calls,
    fragment_text,
    parser_for,
    split_at,
)

NAMES = VARIANTS


def written(name: str, before: str, pairs, after: str) -> str:
    """An output as each format's model writes it, built without the parser's own code."""
    if name == "hermes":
        blocks = [
            f'<tool_call>\n{{"name": {json.dumps(c.name)}, "arguments": {c.arguments}}}\n</tool_call>'
            for c, _ in pairs
        ]
        return before + "\n".join(blocks) + after
    if name == "llama3_json":
        objects = [
            f'{{"name": {json.dumps(c.name)}, "parameters": {c.arguments}}}' for c, _ in pairs
        ]
        return "<|python_tag|>" + "; ".join(objects) + after
    if name == "mistral_named":
        return (
            before + "".join(f"[TOOL_CALLS]{c.name}[ARGS]{c.arguments}" for c, _ in pairs) + after
        )
    objects = [f'{{"name":{json.dumps(c.name)},"arguments":{c.arguments}}}' for c, _ in pairs]
    return before + "[TOOL_CALLS] [" + ", ".join(objects) + "]" + after


def streamed(name: str, chunks: list[str]) -> ParsedOutput:
    stream = parser_for(name).stream()
    events = [e for chunk in chunks for e in stream.feed(chunk)] + stream.finish()
    names_first = set()
    for event in events:  # a call's name always comes before its arguments
        if isinstance(event, CallStarted):
            names_first.add(event.index)
        if isinstance(event, ArgumentsDelta):
            assert event.index in names_first
    return fold_events(events)


def assert_every_split_matches(name: str, text: str, cuts: list[int]) -> None:
    whole = parser_for(name).parse(text)
    assert streamed(name, list(text)) == whole  # every character alone
    for k in range(len(text) + 1):
        assert streamed(name, [text[:k], text[k:]]) == whole, k
    assert streamed(name, split_at(text, cuts)) == whole


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_whole_parse_returns_the_calls_written(name, data):
    pairs = data.draw(calls())
    before = data.draw(PROSE).replace("{", "") if name != "llama3_json" else ""
    after = " " + data.draw(PROSE.filter(lambda s: s.strip()[:1].isalpha()))
    parsed = parser_for(name).parse(written(name, before, pairs, after))
    assert [c.name for c in parsed.calls] == [c.name for c, _ in pairs]
    assert [json.loads(c.arguments) for c in parsed.calls] == [args for _, args in pairs]
    assert parsed.content == before.rstrip() + after.lstrip()


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_streaming_a_clean_output_at_any_split_equals_the_whole_parse(name, data, cuts):
    pairs = data.draw(calls())
    text = written(name, data.draw(PROSE), pairs, data.draw(PROSE))
    assert_every_split_matches(name, text, cuts)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=150, deadline=None)
@given(data=st.data(), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_streaming_any_text_at_any_split_equals_the_whole_parse(name, data, cuts):
    assert_every_split_matches(name, data.draw(fragment_text(name)), cuts)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(pairs=calls())
def test_a_cut_off_call_keeps_its_name_and_the_arguments_written_so_far(name, pairs):
    text = written(name, "", pairs, "")
    call, _ = pairs[-1]
    cut = text.rindex(call.arguments) + len(call.arguments) // 2
    parsed = parser_for(name).parse(text[:cut])
    assert parsed.calls[-1].name == call.name
    assert call.arguments.startswith(parsed.calls[-1].arguments)


@pytest.mark.parametrize("name", NAMES)
@settings(max_examples=40, deadline=None)
@given(pairs=calls(max_size=2))
def test_render_calls_is_read_back_by_the_parser(name, pairs):
    parser = parser_for(name)
    parsed = parser.parse(parser.render_calls([c for c, _ in pairs]))
    assert parsed == ParsedOutput("", tuple(c for c, _ in pairs))


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("hermes", "I think <tool_call>not json</tool_call> so."),
        ("hermes", '<tool_call>{"arguments": {}}</tool_call>'),
        ("llama3_json", '{"city": "Paris", "temp": 20}'),
        ("llama3_json", "Sure, here it is."),
        ("mistral", "[TOOL_CALLS] no list here"),
        ("mistral", '[TOOL_CALLS][{"id": 3}]'),
        ("mistral_named", "[TOOL_CALLS]get weather[ARGS]{}"),
        ("mistral_named", "[TOOL_CALLS][ARGS]{}"),
        ("mistral_named", "Done. [TOOL_CALLS]get_weather[AR"),
        ("mistral_named", "[TOOL_CALLS]f[CALL_ID]x-1[ARGS]{}"),
    ],
)
def test_text_that_is_not_a_call_is_content_exactly(name, text):
    assert parser_for(name).parse(text) == ParsedOutput(text)


def test_a_call_without_arguments_gets_an_empty_object():
    parsed = make_parser("hermes").parse('<tool_call>{"name": "now"}</tool_call>')
    assert [(c.name, c.arguments) for c in parsed.calls] == [("now", "{}")]


def test_arguments_written_as_a_json_string_are_unquoted():
    text = '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    assert make_parser("hermes").parse(text).calls[0].arguments == '{"x": 1}'


@pytest.mark.parametrize("name", ["mistral", "mistral_named"])
def test_mistral_reads_both_forms_whatever_its_template_writes(name):
    text = '[TOOL_CALLS][{"name": "a", "arguments": {"x": 1}}] then [TOOL_CALLS]b[ARGS]{"y": [2]}'
    parsed = parser_for(name).parse(text)
    assert parsed == ParsedOutput("then", (ToolCall("a", '{"x": 1}'), ToolCall("b", '{"y": [2]}')))


def test_the_named_form_drops_the_call_id_and_reads_what_is_not_an_object_as_content():
    parser = parser_for("mistral_named")
    text = '[TOOL_CALLS]f[CALL_ID]a1B2c3D4e[ARGS] {"x": 1}[TOOL_CALLS]g[ARGS]fine.'
    assert parser.parse(text) == ParsedOutput(
        "fine.", (ToolCall("f", '{"x": 1}'), ToolCall("g", "{}"))
    )


def test_the_template_picks_the_form_mistral_writes():
    call = ToolCall("f", '{"x": 1}')
    assert parser_for("mistral_named").render_calls([call]) == '[TOOL_CALLS]f[ARGS]{"x": 1}'
    assert make_parser("mistral").render_calls([call]).startswith("[TOOL_CALLS][{")
