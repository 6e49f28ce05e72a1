"""Chat messages rendered as a harmony prompt (gpt-oss), special tokens written as their text.

Contract: `render_harmony(messages, functions, reasoning_effort, today, add_generation_prompt)`
returns the prompt text for OpenAI chat message dicts (`role`, `content`, an assistant's
`tool_calls`, a tool message's `tool_call_id` / `name`):
- a system message: the model identity, knowledge cutoff and `today`, `Reasoning: EFFORT`
  (low / medium / high, default medium), the valid channels, and with functions the line
  sending their calls to the commentary channel;
- a developer message when the request has system / developer messages (their texts joined
  under `# Instructions`) or functions (`# Tools`, `## functions` and the TypeScript-like
  namespace of typescript.py);
- each user message; each assistant message as a `final` message (or, when it made calls, a
  `commentary` preamble) and each of its calls as a commentary message `to=functions.NAME`
  with `<|constrain|>json`, ending `<|call|>`; each tool result as a message from
  `functions.NAME` to the assistant on the commentary channel (the name from the message or
  from the call its `tool_call_id` answers; ValueError when neither gives one);
- then `<|start|>assistant`, when `add_generation_prompt`.
Earlier turns' reasoning is not rendered (harmony drops it from histories).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from server.chat.harmony.typescript import functions_namespace
from server.chat.tool_calls.base import FunctionSpec

START, END, MESSAGE, CHANNEL = "<|start|>", "<|end|>", "<|message|>", "<|channel|>"
CONSTRAIN, CALL, RETURN = "<|constrain|>", "<|call|>", "<|return|>"
# The special tokens a vocabulary must have (one token each) for the chat route to use harmony.
HARMONY_MARKERS = (START, END, MESSAGE, CHANNEL)
EFFORTS = ("low", "medium", "high")


def _message(header: str, body: str, end: str = END) -> str:
    return f"{START}{header}{MESSAGE}{body}{end}"


def _system(effort: str, today: str, tools: bool) -> str:
    lines = [
        "You are ChatGPT, a large language model trained by OpenAI.",
        "Knowledge cutoff: 2024-06",
        f"Current date: {today}",
        "",
        f"Reasoning: {effort}",
        "",
        "# Valid channels: analysis, commentary, final. Channel must be included for every "
        "message.",
    ]
    if tools:
        lines.append("Calls to these tools must go to the commentary channel: 'functions'.")
    return _message("system", "\n".join(lines))


def _developer(instructions: str, functions: Sequence[FunctionSpec]) -> str:
    parts = []
    if instructions:
        parts.append(f"# Instructions\n\n{instructions}")
    if functions:
        parts.append(f"# Tools\n\n## functions\n\n{functions_namespace(functions)}")
    return _message("developer", "\n\n".join(parts))


def render_harmony(
    messages: Sequence[dict[str, Any]],
    functions: Sequence[FunctionSpec],
    reasoning_effort: str | None,
    today: str,
    add_generation_prompt: bool = True,
) -> str:
    effort = reasoning_effort or "medium"
    if effort not in EFFORTS:
        raise ValueError(f"reasoning_effort must be one of {', '.join(EFFORTS)}, got {effort!r}")
    parts = [_system(effort, today, bool(functions))]
    instructions = "\n\n".join(
        m["content"] for m in messages if m["role"] in ("system", "developer") and m["content"]
    )
    if instructions or functions:
        parts.append(_developer(instructions, functions))
    names: dict[str, str] = {}  # a call's id -> its function, for the tool results
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        if role == "user":
            parts.append(_message("user", content))
        elif role == "assistant":
            calls = m.get("tool_calls") or ()
            if content:
                channel = "commentary" if calls else "final"
                parts.append(_message(f"assistant{CHANNEL}{channel}", content))
            for call in calls:
                function = call["function"]
                names[call.get("id") or ""] = function["name"]
                header = f"assistant{CHANNEL}commentary to=functions.{function['name']} "
                parts.append(_message(f"{header}{CONSTRAIN}json", function["arguments"], CALL))
        elif role == "tool":
            name = m.get("name") or names.get(m.get("tool_call_id") or "")
            if not name:
                raise ValueError(
                    "a tool message needs the tool_call_id of an earlier assistant call (or a "
                    "name) to say which function answered"
                )
            parts.append(_message(f"functions.{name} to=assistant{CHANNEL}commentary", content))
    if add_generation_prompt:
        parts.append(f"{START}assistant")
    return "".join(parts)
