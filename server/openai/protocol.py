"""OpenAI API request bodies (pydantic): completions, chat (messages, tools), tokenize.

Contract: these models only describe the JSON (types, defaults, unknown fields ignored); a wrong
type is a 400 naming the field (server/errors.py). Mapping them to SamplingParams happens in
server/openai/params.py; the response shapes are built in server/openai/responses.py.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from server.engine_params import FaultFields
from server.structured_fields import GuidedFields, ResponseFormat


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool | None = None


class SamplingFields(_Body, GuidedFields):
    """Fields shared by /v1/completions and /v1/chat/completions (None: the default)."""

    model: str | None = None
    n: int | None = None
    best_of: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool | None = None
    min_tokens: int | None = None
    use_beam_search: bool | None = None
    length_penalty: float | None = None
    include_stop_str_in_output: bool | None = None
    skip_special_tokens: bool | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None
    timeout: float | None = None  # seconds; the request is aborted after it, even if queued
    priority: int | None = None  # an extension (as vLLM's): lower runs first; default 0
    fault: FaultFields | None = None  # 400 unless --enable-fault-injection


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None


class TextPart(_Body):
    type: Literal["text"]
    text: str


class FunctionCall(_Body):
    name: str
    arguments: str  # JSON text of the arguments object


class ToolCallItem(_Body):
    """A call the assistant made (in a history message, or in a response)."""

    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionDefinition(_Body):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None  # a JSON Schema of an object
    strict: bool | None = None


class ToolDefinition(_Body):
    type: Literal["function"]
    function: FunctionDefinition


class NamedFunction(_Body):
    name: str


class NamedToolChoice(_Body):
    type: Literal["function"]
    function: NamedFunction


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[TextPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallItem] | None = None  # assistant messages
    tool_call_id: str | None = None  # tool messages: the call this answers
    reasoning_content: str | None = None  # accepted for round trips; not shown to the model

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(p.text for p in self.content or [])

    def for_template(self) -> dict[str, Any]:
        message: dict[str, Any] = {"role": self.role, "content": self.text()}
        if self.name is not None:
            message["name"] = self.name
        if self.tool_call_id is not None:
            message["tool_call_id"] = self.tool_call_id
        if self.tool_calls:
            message["tool_calls"] = [call.model_dump() for call in self.tool_calls]
        return message


class ChatCompletionRequest(SamplingFields):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    add_generation_prompt: bool | None = None
    response_format: ResponseFormat | None = None
    tools: list[ToolDefinition] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None


class TokenizeRequest(_Body):
    """vLLM-style /tokenize: a prompt, or chat messages rendered through the chat template."""

    model: str | None = None
    prompt: str | None = None
    messages: list[ChatMessage] | None = None
    add_special_tokens: bool | None = None
    add_generation_prompt: bool | None = None


class DetokenizeRequest(_Body):
    model: str | None = None
    tokens: list[int]
