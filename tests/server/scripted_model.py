"""The scripted model the Responses and Anthropic tests run on (the fake engine's `script`): it calls
get_weather when the tools are in its prompt, answers once a tool result is there, thinks when
asked to, writes JSON when asked for it, and otherwise says hello.

The fallback tool prompt (the fake tokenizer's template shows no tools) teaches Hermes calls,
so a call is `<tool_call>{...}</tool_call>` and a tool result arrives as `<tool_response>`.
"""

from __future__ import annotations

HELLO = "Hello from tgserve."
CALL = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>'
SUNNY = "It is sunny in Paris."
THOUGHT, ANSWER = "Two and two make four.", "The answer is 4."
CITY_JSON = '{"name": "Paris", "country": "France"}'
WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "The weather in a city",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string"}},
        "required": ["city"],
        "additionalProperties": False,
    },
}


def script(prompt: str) -> str:
    if "<tool_response>" in prompt:
        return SUNNY
    if "get_weather" in prompt:
        return CALL
    if "think" in prompt:
        return f"<think>{THOUGHT}</think>{ANSWER}"
    if "JSON" in prompt:
        return CITY_JSON
    return HELLO
