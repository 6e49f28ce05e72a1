"""Request examples of the main routes, shown by /docs and /redoc (OpenAPI `examples`).

Contract: `EXAMPLES` maps (path, method) to OpenAPI named examples (`{name: {"summary",
"value"}}`); every value is a request the route answers with a 200 on any served model
(tests/server/test_openapi_docs.py sends each one). `model` is left out, so they work whatever
the served name is.
"""

from __future__ import annotations

from typing import Any

_CHAT = [{"role": "user", "content": "What is the capital of France?"}]
_PERSON = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}
_WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}


def _example(summary: str, value: dict[str, Any]) -> dict[str, Any]:
    return {"summary": summary, "value": value}


_TGI = {
    "greedy": _example(
        "Greedy, 20 new tokens, with details",
        {
            "inputs": "The capital of France is",
            "parameters": {"max_new_tokens": 20, "details": True},
        },
    ),
    "sampled": _example(
        "Sampled and seeded",
        {
            "inputs": "Once upon a time",
            "parameters": {"do_sample": True, "temperature": 0.8, "seed": 7, "max_new_tokens": 30},
        },
    ),
}

EXAMPLES: dict[tuple[str, str], dict[str, Any]] = {
    ("/v1/chat/completions", "post"): {
        "greedy": _example(
            "A greedy answer", {"messages": _CHAT, "temperature": 0, "max_tokens": 30}
        ),
        "streamed": _example(
            "Streamed, with a last usage chunk",
            {
                "messages": _CHAT,
                "max_tokens": 30,
                "stream": True,
                "stream_options": {"include_usage": True},
            },
        ),
        "json_schema": _example(
            "An answer that follows a JSON Schema",
            {
                "messages": [{"role": "user", "content": "Invent a person."}],
                "max_tokens": 60,
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "person", "schema": _PERSON},
                },
            },
        ),
        "tools": _example(
            "A required tool call",
            {
                "messages": [{"role": "user", "content": "What is the weather in Paris?"}],
                "tools": [_WEATHER_TOOL],
                "tool_choice": "required",
                "max_tokens": 60,
            },
        ),
    },
    ("/v1/completions", "post"): {
        "greedy": _example(
            "Greedy completion",
            {"prompt": "The capital of France is", "max_tokens": 16, "temperature": 0},
        ),
        "choices": _example(
            "Two seeded samples with log probabilities",
            {"prompt": "Once upon a time", "n": 2, "seed": 7, "logprobs": 2, "max_tokens": 16},
        ),
    },
    ("/generate", "post"): _TGI,
    ("/generate_stream", "post"): _TGI,
    ("/", "post"): _TGI,
    ("/v1/messages", "post"): {
        "message": _example(
            "A message", {"max_tokens": 64, "messages": [{"role": "user", "content": "Hello!"}]}
        ),
    },
    ("/v1/responses", "post"): {
        "response": _example(
            "A response", {"input": "Write one sentence about the sea.", "max_output_tokens": 40}
        ),
    },
    ("/tokenize", "post"): {
        "text": _example("Text", {"prompt": "Hello world"}),
        "chat": _example("Chat messages, through the chat template", {"messages": _CHAT}),
    },
}
