"""Tool calls of Qwen3-Coder (XML), DeepSeek V3 / R1 / V3.1 (special-token blocks) and Llama 3.2+ /
Llama 4 (pythonic lists): written calls parse back, streaming in any split equals the whole
parse, calls the parser renders read back, text that is no call stays content, and the format
is chosen from the chat template.

Oracles: calls are drawn and written in each format by hand-built strings (not the parsers'
code); their arguments must json.loads to what was drawn. Calls rendered by a chat template
(transformers' jinja, through `apply_chat_template`, in templates written here the way these
models' templates write an assistant's calls) must parse back to the history's calls.
"""

from __future__ import annotations

import json
import keyword

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from server.chat.tool_calls import (
    PARSERS,
    FunctionSpec,
    ToolCall,
    detect_parser,
    fold_events,
    make_parser,
)
from server.chat.tool_calls.deepseek_v3 import CALL_BEGIN, CALL_END, CALLS_BEGIN, CALLS_END, SEP
from server.chat.tool_calls.enforce import tool_grammar
from server.chat.tool_calls.events import ParsedOutput
from server.chat.tool_calls.plan import ToolPlan
from tests.server.chat.tool_calls.outputs import (
    JSON_VALUES,
    OTHER_FORMATS,
    PROSE,
    VARIANTS,
    split_at,
)
from tests.server.chat.tool_calls.test_grammar import CLOCK, WEATHER, accepts

FORMATS = ["qwen3_xml", "deepseek_v3", "deepseek_v3_plain", "pythonic"]
IDENTIFIERS = st.from_regex(r"[a-z_][a-z0-9_]{0,6}", fullmatch=True)
# Pythonic calls are calls to plain names with keyword arguments (pythonic.py's contract): a
# Python keyword is neither (`[or()]`, `[f(if=1)]` do not parse), so those answers are content.
PY_NAMES = IDENTIFIERS.filter(lambda s: not keyword.iskeyword(s))
XML_KEYS = st.text(alphabet='abcxyz_ "\\}{é', min_size=1, max_size=5)


def parser_for(fmt: str, calls: list[tuple[str, dict]] = ()):
    if fmt == "deepseek_v3_plain":
        return make_parser("deepseek_v3", template="{{ name }}<｜tool▁sep｜>{{ arguments }}")
    # the XML format types values by the schema: a property is a string where one was drawn
    specs = {}
    for name, args in calls:
        props = specs.setdefault(name, {})
        props.update({k: {"type": "string"} if isinstance(v, str) else {} for k, v in args.items()})
    functions = [FunctionSpec(n, None, {"properties": p}) for n, p in specs.items()]
    return make_parser(fmt).with_tools(functions)


@st.composite
def drawn_calls(draw, fmt: str) -> list[tuple[str, dict]]:
    names = PY_NAMES if fmt == "pythonic" else IDENTIFIERS
    keys = PY_NAMES if fmt == "pythonic" else XML_KEYS
    return draw(
        st.lists(
            st.tuples(names, st.dictionaries(keys, JSON_VALUES, max_size=3)),
            min_size=1,
            max_size=3,
        )
    )


def py(value) -> str:
    if value is None or isinstance(value, bool):
        return {None: "None", True: "True", False: "False"}[value]
    return json.dumps(value, ensure_ascii=False)  # JSON values are Python literals too (and
    # true / false / null are read as JSON's)


def written(fmt: str, calls: list[tuple[str, dict]]) -> str:
    if fmt == "qwen3_xml":
        return "\n".join(
            f"<tool_call>\n<function={name}>\n"
            + "".join(
                f"<parameter={k}>\n{v if isinstance(v, str) else json.dumps(v)}\n</parameter>\n"
                for k, v in args.items()
            )
            + "</function>\n</tool_call>"
            for name, args in calls
        )
    if fmt == "pythonic":
        one = [
            f"{name}(" + ", ".join(f"{k}={py(v)}" for k, v in a.items()) + ")" for name, a in calls
        ]
        return "[" + ", ".join(one) + "]"
    if fmt == "deepseek_v3":
        body = [f"function{SEP}{n}\n```json\n{json.dumps(a)}\n```" for n, a in calls]
    else:
        body = [f"{n}{SEP}{json.dumps(a)}" for n, a in calls]
    return CALLS_BEGIN + "".join(CALL_BEGIN + b + CALL_END for b in body) + CALLS_END


def streamed(parser, chunks: list[str]) -> ParsedOutput:
    stream = parser.stream()
    return fold_events([e for c in chunks for e in stream.feed(c)] + stream.finish())


def test_every_registered_format_is_tested():
    assert sorted(set(VARIANTS) | set(OTHER_FORMATS)) == sorted([*PARSERS, "mistral_named"])
    assert set(OTHER_FORMATS) <= {f.removesuffix("_plain") for f in FORMATS}


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=40, deadline=None)
@given(data=st.data(), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_written_calls_parse_back_streamed_in_any_split(fmt, data, cuts):
    calls = data.draw(drawn_calls(fmt))
    parser = parser_for(fmt, calls)
    before = "" if fmt == "pythonic" else data.draw(PROSE)
    after = "" if fmt == "pythonic" else data.draw(PROSE)
    text = before + written(fmt, calls) + after
    whole = parser.parse(text)
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == calls
    assert whole.content == before.rstrip() + after.lstrip()
    assert streamed(parser, list(text)) == whole
    assert streamed(parser, split_at(text, cuts)) == whole
    for k in range(0, len(text) + 1, 7):
        assert streamed(parser, [text[:k], text[k:]]) == whole


PIECES = {
    "qwen3_xml": ["<tool_call>", "</tool_call>", "<function=f>", "</function>", "<parameter=a>"],
    "deepseek_v3": [CALLS_BEGIN, CALLS_END, CALL_BEGIN, CALL_END, SEP, "function", "```json"],
    "pythonic": ["[", "]", "f(", ")", "a=", "1", '"x"', ", ", "True"],
}


@pytest.mark.parametrize("fmt", ["qwen3_xml", "deepseek_v3", "pythonic"])
@settings(max_examples=100, deadline=None)
@given(data=st.data(), cuts=st.lists(st.integers(0, 10_000), max_size=8))
def test_any_text_streamed_in_any_split_equals_the_whole_parse(fmt, data, cuts):
    pieces = st.sampled_from(PIECES[fmt] + ["\n", " ", "x", "{", "}", '"', "é"])
    text = "".join(data.draw(st.lists(pieces, max_size=20)))
    parser = parser_for(fmt)
    whole = parser.parse(text)
    assert streamed(parser, list(text)) == whole
    assert streamed(parser, split_at(text, cuts)) == whole


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=40, deadline=None)
@given(data=st.data())
def test_rendered_calls_read_back(fmt, data):
    calls = data.draw(drawn_calls(fmt))
    parser = parser_for(fmt, calls)
    text = parser.render_calls([ToolCall(n, json.dumps(a)) for n, a in calls])
    assert [(c.name, json.loads(c.arguments)) for c in parser.parse(text).calls] == calls


@pytest.mark.parametrize(
    ("fmt", "text"),
    [
        ("qwen3_xml", '<tool_call>\n{"name": "f"}\n</tool_call>'),
        ("qwen3_xml", "<tool_call>\n<function=f>\nstray text\n</function>\n</tool_call>"),
        ("qwen3_xml", "See <function=f> in the docs."),
        (
            "deepseek_v3",
            f"{CALLS_BEGIN}{CALL_BEGIN}function{SEP}f\n```json\n[1]\n```{CALL_END}{CALLS_END}",
        ),
        ("deepseek_v3", f"{CALLS_BEGIN}nothing{CALLS_END}"),
        ("pythonic", "[1, 2, 3]"),
        ("pythonic", "[f(1)]"),
        ("pythonic", "[f(a=g())]"),
        ("pythonic", "Sure: [f(a=1)]"),
        ("pythonic", "[note] done"),
        ("pythonic", "[or()]"),  # a keyword is not a name: not Python, so content
        ("pythonic", "[f(if=1)]"),
    ],
)
def test_text_that_is_no_call_is_content_exactly(fmt, text):
    parser = parser_for(fmt)
    assert parser.parse(text) == ParsedOutput(text)
    assert streamed(parser, list(text)) == ParsedOutput(text)


def test_xml_values_are_typed_by_the_schema():
    text = "<tool_call>\n<function=f>\n<parameter=a>\n12\n</parameter>\n<parameter=b>\n12\n</parameter>\n</function>\n</tool_call>"
    spec = FunctionSpec(
        "f", None, {"properties": {"a": {"type": "string"}, "b": {"type": "integer"}}}
    )
    (call,) = make_parser("qwen3_xml").with_tools([spec]).parse(text).calls
    assert json.loads(call.arguments) == {"a": "12", "b": 12}


@pytest.mark.parametrize(
    ("mark", "name"),
    [
        ("{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}", "qwen3_xml"),
        (
            "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>'}}",
            "deepseek_v3",
        ),
        ("Respond in the format [func_name1(params_name1=params_value1)]", "pythonic"),
    ],
)
def test_the_format_is_chosen_from_the_template(mark, name):
    assert detect_parser("{# a template #}" + mark) == name


REQUIRED_ARGS = st.fixed_dictionaries(
    {"city": st.text(alphabet="abc é-", max_size=8), "days": st.integers(1, 9)}
).map(lambda a: {"city": a["city"], "days": a["days"]})  # the schema's order


@pytest.mark.parametrize("fmt", FORMATS)
@settings(max_examples=15, deadline=None)
@given(
    calls=st.lists(
        st.one_of(REQUIRED_ARGS.map(lambda a: ("get_weather", a)), st.just(("now", {}))),
        min_size=1,
        max_size=3,
    )
)
def test_an_enforced_choice_accepts_valid_calls_which_parse_back(fmt, calls):
    parser = parser_for(fmt).with_tools([WEATHER, CLOCK])
    grammar = tool_grammar(parser, ToolPlan((WEATHER, CLOCK), "required"), None)
    text = parser.render_calls([ToolCall(f, json.dumps(a, ensure_ascii=False)) for f, a in calls])
    assert accepts(grammar, text), text
    assert [(c.name, json.loads(c.arguments)) for c in parser.parse(text).calls] == calls
    for broken in ({"city": "x"}, {"city": "x", "days": 0}):
        bad = parser.render_calls([ToolCall("get_weather", json.dumps(broken))])
        assert not accepts(grammar, bad), bad
    named = tool_grammar(parser, ToolPlan((WEATHER, CLOCK), "function", "now"), None)
    assert accepts(named, parser.render_calls([ToolCall("now", "{}")]))
    assert not accepts(
        named, parser.render_calls([ToolCall("get_weather", json.dumps(calls[0][1]))])
    )
