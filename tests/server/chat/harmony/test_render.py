"""Harmony prompts (gpt-oss) rendered from OpenAI chat messages equal hand-written transcripts
of the published format: system (identity, date, reasoning effort, channels), developer
(instructions, the functions namespace), user, assistant history with a call and its result."""

from __future__ import annotations

import pytest

from server.chat.harmony import render_harmony
from server.chat.tool_calls.base import FunctionSpec

WEATHER = FunctionSpec(
    "get_weather",
    "Current weather in a city",
    {
        "type": "object",
        "properties": {
            "city": {"type": "string", "description": "The city's name"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"], "default": "celsius"},
            "days": {"type": "array", "items": {"type": "integer"}},
        },
        "required": ["city"],
    },
)
NOW = FunctionSpec("get_time", None, {"type": "object"})

SYSTEM_HIGH = (
    "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
    "Knowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: high\n\n"
    "# Valid channels: analysis, commentary, final. Channel must be included for every "
    "message.<|end|>"
)


def test_plain_conversation() -> None:
    messages = [
        {"role": "system", "content": "Answer briefly."},
        {"role": "user", "content": "Hi"},
        {"role": "assistant", "content": "Hello!"},
        {"role": "user", "content": "2+2?"},
    ]
    want = (
        SYSTEM_HIGH
        + "<|start|>developer<|message|># Instructions\n\nAnswer briefly.<|end|>"
        + "<|start|>user<|message|>Hi<|end|>"
        + "<|start|>assistant<|channel|>final<|message|>Hello!<|end|>"
        + "<|start|>user<|message|>2+2?<|end|>"
        + "<|start|>assistant"
    )
    assert render_harmony(messages, (), "high", "2025-08-05") == want


def test_tools_a_call_and_its_result() -> None:
    messages = [
        {"role": "user", "content": "Weather in Paris?"},
        {
            "role": "assistant",
            "content": "",
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": '{"sky": "sunny"}'},
    ]
    want = (
        "<|start|>system<|message|>You are ChatGPT, a large language model trained by OpenAI.\n"
        "Knowledge cutoff: 2024-06\nCurrent date: 2025-08-05\n\nReasoning: medium\n\n"
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.\nCalls to these tools must go to the commentary channel: 'functions'.<|end|>"
        "<|start|>developer<|message|># Tools\n\n## functions\n\nnamespace functions {\n\n"
        "// Current weather in a city\n"
        "type get_weather = (_: {\n"
        "// The city's name\n"
        "city: string,\n"
        'unit?: "celsius" | "fahrenheit", // default: "celsius"\n'
        "days?: number[],\n"
        "}) => any;\n\n"
        "type get_time = () => any;\n\n"
        "} // namespace functions<|end|>"
        "<|start|>user<|message|>Weather in Paris?<|end|>"
        "<|start|>assistant<|channel|>commentary to=functions.get_weather <|constrain|>json"
        '<|message|>{"city": "Paris"}<|call|>'
        "<|start|>functions.get_weather to=assistant<|channel|>commentary"
        '<|message|>{"sky": "sunny"}<|end|>'
        "<|start|>assistant"
    )
    assert render_harmony(messages, (WEATHER, NOW), None, "2025-08-05") == want


def test_a_tool_result_without_its_call_is_refused() -> None:
    with pytest.raises(ValueError, match="tool_call_id"):
        render_harmony([{"role": "tool", "content": "x", "tool_call_id": "nope"}], (), None, "d")
