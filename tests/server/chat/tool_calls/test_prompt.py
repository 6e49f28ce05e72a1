"""Histories with tool calls and tool answers, rendered through chat templates.

Oracles: for a template that takes `tools` (a Hermes-style template written here), transformers'
own renderer given the history the way its docs ask for it (arguments as objects); for the
default model's template (SmolLM2, which knows nothing of tools), the fallback must show every
function's spec, write the past calls so the model's parser reads them back, and turn tool
answers into user turns.
"""

from __future__ import annotations

import json

import pytest
from transformers.utils.chat_template_utils import render_jinja_template

from models.default_model import default_model_path
from models.tokenizer.chat_template import ChatTemplate
from models.tokenizer.loading import load_tokenizer
from server.chat.tool_calls import FunctionSpec, make_parser
from server.chat.tool_calls.plan import ToolPlan
from server.chat.tool_calls.prompt import template_inputs
from server.openai.protocol import ChatMessage

TOOL_TEMPLATE = """{%- if tools %}<|system|>Tools:
{% for t in tools %}{{ t | tojson }}
{% endfor %}{% endif %}
{%- for m in messages %}<|{{ m.role }}|>{{ m.content }}
{%- if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{"name": "{{ c.function.name }}", \
"arguments": {{ c.function.arguments | tojson }}}</tool_call>{% endfor %}{% endif %}
{%- if m.tool_call_id %} (answers {{ m.tool_call_id }}){% endif %}
{% endfor %}{% if add_generation_prompt %}<|assistant|>{% endif %}"""

WEATHER = FunctionSpec(
    "get_weather",
    "Weather now",
    {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
)
PLAN = ToolPlan((WEATHER,), "auto")
ARGS = {"city": "Paris", "note": "é"}
HISTORY = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Weather in Paris and Rome?"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "get_weather", "arguments": json.dumps(ARGS)},
            },
            {
                "id": "call_2",
                "type": "function",
                "function": {"name": "get_weather", "arguments": '{"city": "Rome"}'},
            },
        ],
    },
    {"role": "tool", "tool_call_id": "call_1", "content": "18 C"},
    {"role": "tool", "tool_call_id": "call_2", "content": "25 C"},
]


def messages() -> list[dict]:
    return [ChatMessage.model_validate(m).for_template() for m in HISTORY]


def test_a_template_with_tools_renders_the_history_as_transformers_does():
    parser = make_parser("hermes")
    dicts, extra = template_inputs(messages(), PLAN, parser, takes_tools=True)
    ours = ChatTemplate(TOOL_TEMPLATE, {}).render(dicts, True, **extra)
    expected_history = json.loads(json.dumps(HISTORY))
    for m in expected_history:
        m["content"] = m["content"] or ""
        for call in m.get("tool_calls", []):
            call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    tools = [{"type": "function", "function": vars(WEATHER)}]
    theirs, _ = render_jinja_template(
        [expected_history], tools=tools, chat_template=TOOL_TEMPLATE, add_generation_prompt=True
    )
    assert ours == theirs[0]
    assert ChatTemplate(TOOL_TEMPLATE, {}).uses("tools")


def test_tool_choice_none_keeps_the_tools_out_of_the_prompt():
    dicts, extra = template_inputs(messages(), ToolPlan((WEATHER,), "none"), None, True)
    assert extra == {}


@pytest.fixture(scope="module")
def smollm_template() -> ChatTemplate:
    template = load_tokenizer(default_model_path()).chat_template
    assert template is not None and not template.uses("tools")
    return template


@pytest.mark.parametrize("name", ["hermes", "llama3_json", "mistral"])
def test_a_template_without_tools_gets_the_fallback_prompt(smollm_template, name):
    parser = make_parser(name)
    dicts, extra = template_inputs(messages(), PLAN, parser, takes_tools=False)
    text = smollm_template.render(dicts, True, **extra)
    assert extra == {}
    assert [d["role"] for d in dicts] == ["system", "user", "assistant", "user"]
    assert dicts[0]["content"].startswith("Be brief.\n\n")  # the tools join the system turn
    assert json.dumps(WEATHER.parameters) in text
    assert "18 C" in dicts[3]["content"] and "25 C" in dicts[3]["content"]
    assert dicts[3]["content"].count("<tool_response>") == 2
    calls = parser.parse(dicts[2]["content"]).calls
    assert [(c.name, json.loads(c.arguments)) for c in calls] == [
        ("get_weather", ARGS),
        ("get_weather", {"city": "Rome"}),
    ]
    assert text.endswith("<|im_start|>assistant\n")


def test_the_fallback_opens_a_system_turn_when_there_is_none(smollm_template):
    history = [{"role": "user", "content": "hi"}]
    dicts, _ = template_inputs(history, PLAN, make_parser("hermes"), takes_tools=False)
    assert dicts[0]["role"] == "system" and "<tools>" in dicts[0]["content"]
    assert "You are a helpful AI assistant named SmolLM" not in smollm_template.render(dicts)
