"""Anthropic Messages API request bodies (pydantic): /v1/messages and /v1/messages/count_tokens.

Contract: these models only describe the JSON (types, defaults, unknown fields ignored); a wrong
type, or a content block of a type tgserve does not read (image, document, server tools' blocks),
is a 400 naming the field, in Anthropic's error shape (server/errors.py). How they become a chat
conversation and SamplingParams: server/anthropic/convert.py.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class TextBlock(_Body):
    type: Literal["text"] = Field(description="A block of text.")
    text: str = Field(description="The text.")


class ToolUseBlock(_Body):
    type: Literal["tool_use"] = Field(description="A call the assistant made (in a history).")
    id: str = Field(description="The call's id, answered by a tool_result's tool_use_id.")
    name: str = Field(description="The function called.")
    input: dict[str, Any] = Field(description="The call's arguments, a JSON object.")


class ToolResultBlock(_Body):
    type: Literal["tool_result"] = Field(description="The result of a call, in a user turn.")
    tool_use_id: str = Field(description="The id of the tool_use block this answers.")
    content: str | list[TextBlock] | None = Field(
        default=None, description="The result: text, or text blocks (joined)."
    )
    is_error: bool | None = Field(
        default=None, description="The call failed; the content says why (shown to the model)."
    )


class ThinkingBlock(_Body):
    type: Literal["thinking"] = Field(description="Reasoning the assistant wrote (in a history).")
    thinking: str = Field(description="The reasoning text; not shown to the model again.")
    signature: str | None = Field(default=None, description="Accepted and ignored.")


class RedactedThinkingBlock(_Body):
    type: Literal["redacted_thinking"] = Field(description="Accepted in a history and ignored.")
    data: str | None = Field(default=None, description="Accepted and ignored.")


Block = Annotated[
    TextBlock | ToolUseBlock | ToolResultBlock | ThinkingBlock | RedactedThinkingBlock,
    Field(discriminator="type"),
]


class Message(_Body):
    role: Literal["user", "assistant"] = Field(description="Who wrote this turn.")
    content: str | list[Block] = Field(description="The turn's text, or its content blocks.")


class Tool(_Body):
    name: str = Field(description="The function's name: 1-64 letters, digits, '_' or '-'.")
    description: str | None = Field(default=None, description="What the function does.")
    input_schema: dict[str, Any] = Field(
        description="JSON Schema of the arguments object (type object)."
    )
    type: str | None = Field(
        default=None,
        description="'custom' or absent; server tools (web search, bash, ...) are refused.",
    )


class ToolChoice(_Body):
    type: Literal["auto", "any", "tool", "none"] = Field(
        description="auto: the model chooses; any: it must call one of the tools (held to a "
        "grammar); tool: it must call `name`; none: the tools are not shown."
    )
    name: str | None = Field(default=None, description="The function `type: tool` forces.")
    disable_parallel_tool_use: bool | None = Field(
        default=None, description="At most one call in the answer (any / tool: exactly one)."
    )


class Thinking(_Body):
    type: Literal["enabled", "disabled", "adaptive"] = Field(
        description="enabled / adaptive: the model's reasoning is read into thinking blocks even "
        "when its chat template does not show <think>; disabled: as the model's template says."
    )
    budget_tokens: int | None = Field(
        default=None,
        description="Accepted (>= 1); not enforced apart from max_tokens, which bounds the "
        "reasoning and the answer together.",
    )


class ConversationFields(_Body):
    """What /v1/messages and /v1/messages/count_tokens share: the prompt."""

    model: str | None = Field(default=None, description="A served model name (GET /v1/models).")
    messages: list[Message] = Field(description="The conversation, alternating user / assistant.")
    system: str | list[TextBlock] | None = Field(
        default=None, description="The system prompt: text, or text blocks (joined)."
    )
    tools: list[Tool] | None = Field(default=None, description="Functions the model may call.")
    tool_choice: ToolChoice | None = Field(
        default=None, description="How the model may use the tools (default auto)."
    )
    thinking: Thinking | None = Field(default=None, description="Reasoning output.")


class MessagesRequest(ConversationFields):
    max_tokens: int = Field(description="Most tokens to generate (>= 1).")
    stop_sequences: list[str] | None = Field(
        default=None,
        description="Strings that end the answer (at most 16, each 1-256 characters); the one "
        "met is returned as stop_sequence.",
    )
    stream: bool | None = Field(default=None, description="Stream server-sent events.")
    temperature: float | None = Field(
        default=None, description="Sampling temperature (0: greedy); default 1."
    )
    top_p: float | None = Field(default=None, description="Nucleus sampling, in (0, 1].")
    top_k: int | None = Field(default=None, description="Sample among the k likeliest tokens.")
    metadata: dict[str, Any] | None = Field(default=None, description="Accepted and ignored.")
    mcp_servers: list[Any] | None = Field(default=None, description="Refused (400).")
    container: Any | None = Field(default=None, description="Refused (400).")


class CountTokensRequest(ConversationFields):
    """POST /v1/messages/count_tokens: the prompt's token count, as /v1/messages would send it."""
