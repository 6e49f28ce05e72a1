"""Calls as a chat template writes them parse back, whole and streamed, in the format chosen from
that template: Qwen3-Coder XML, DeepSeek V3 blocks, Llama pythonic lists.

The templates are rendered by transformers' own jinja (`render_jinja_template`, what
`apply_chat_template` runs). They are written here, each writing an assistant's `tool_calls` the
way that model family's template does (the models' own files are not in this repository).
Oracle: the history's calls (names, and arguments as objects) and its text.
"""

from __future__ import annotations

import json

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from server.chat.setup import chat_setup
from server.chat.tool_calls import FunctionSpec, fold_events
from server.settings import Settings
from tests.server.chat.test_setup import FakeTokenizer

_LOOP = "{%- for m in messages %}{%- if m.role == 'assistant' %}[A]{{ m.content }}"
_END = "{%- else %}[{{ m.role }}]{{ m.content }}{%- endif %}[/]{%- endfor %}{{ tools | length }}"
TEMPLATES = {
    "qwen3_xml": _LOOP
    + "{%- for c in m.tool_calls %}{{- '\\n<tool_call>\\n<function=' + c.function.name + '>\\n' }}"
    + "{%- for k, v in c.function.arguments | items %}{{- '<parameter=' + k + '>\\n' }}"
    + "{%- if v is string %}{{ v }}{% else %}{{ v | tojson }}{% endif %}"
    + "{{- '\\n</parameter>\\n' }}{%- endfor %}{{- '</function>\\n</tool_call>' }}{%- endfor %}"
    + _END,
    "deepseek_v3": _LOOP
    + "{%- if m.tool_calls %}{{- '<｜tool▁calls▁begin｜>' }}{%- for c in m.tool_calls %}"
    + "{{- '<｜tool▁call▁begin｜>' + c.type + '<｜tool▁sep｜>' + c.function.name"
    + " + '\\n```json\\n' + (c.function.arguments | tojson) + '\\n```<｜tool▁call▁end｜>' }}"
    + "{%- endfor %}{{- '<｜tool▁calls▁end｜>' }}{%- endif %}"
    + _END,
    "pythonic": "{#- Respond in the format [func_name1(params_name1=params_value1)] #}"
    + _LOOP
    + "{%- if m.tool_calls %}[{%- for c in m.tool_calls %}{{ c.function.name }}("
    + "{%- for k, v in c.function.arguments | items %}{{ k }}={{ v | tojson }}"
    + "{%- if not loop.last %}, {% endif %}{%- endfor %}){%- if not loop.last %}, {% endif %}"
    + "{%- endfor %}]{%- endif %}"
    + _END,
}
CALLS = [
    ("get_weather", {"city": "Paris", "days": 3, "metric": True}),
    ("set_alarm", {"hour": 7, "note": 'é "quoted"\nline', "tags": ["a", "b"], "x": None}),
]
SCHEMAS = [
    FunctionSpec("get_weather", None, {"properties": {"city": {"type": "string"}}}),
    FunctionSpec("set_alarm", None, {"properties": {"note": {"type": "string"}}}),
]


def history(text: str) -> list[dict]:
    calls = [
        {"id": f"c{i}", "type": "function", "function": {"name": n, "arguments": a}}
        for i, (n, a) in enumerate(CALLS)
    ]
    return [
        {"role": "user", "content": "Weather, then an alarm."},
        {"role": "assistant", "content": text, "tool_calls": calls},
    ]


@pytest.mark.parametrize("fmt", sorted(TEMPLATES))
@pytest.mark.parametrize("text", ["", "Let me check."])
def test_calls_the_template_writes_parse_back_whole_and_streamed(fmt, text):
    template = TEMPLATES[fmt]
    (rendered,), _ = render_jinja_template([history(text)], chat_template=template, tools=[{}])
    answer = rendered.split("[A]", 1)[1].split("[/]", 1)[0]  # the assistant's turn as written
    parser = chat_setup(FakeTokenizer(template), Settings()).parser.with_tools(SCHEMAS)
    assert parser.name == fmt  # chosen from the template
    if fmt == "pythonic" and text:
        answer = answer.removeprefix(text)  # pythonic answers are calls alone
    whole = parser.parse(answer)
    assert [(c.name, json.loads(c.arguments)) for c in whole.calls] == CALLS
    assert whole.content == (text if fmt != "pythonic" else "")
    for size in (1, 3, 17):
        stream = parser.stream()
        pieces = [answer[k : k + size] for k in range(0, len(answer), size)]
        events = [e for piece in pieces for e in stream.feed(piece)] + stream.finish()
        assert fold_events(events) == whole
