"""OpenAI Responses API request bodies (pydantic): POST /v1/responses.

Contract: these models only describe the JSON (types, defaults, unknown fields ignored); a wrong
type is a 400 naming the field (server/errors.py). Input items are read loosely here (`InputItem`:
every kind's fields, all optional) and checked item by item in server/responses/convert.py, so
a 400 names the item's own field (`input.2.call_id`). Fields tgserve cannot honour (built-in
tools, background mode, stored prompts, conversations, logprobs) are accepted here and refused
there, naming the field.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class ContentPart(_Body):
    type: str = Field(
        description="input_text / output_text / text (others, as input_image, are refused)."
    )
    text: str | None = Field(default=None, description="The part's text.")


class InputItem(_Body):
    """One input item: a message (`role` + `content`; `type` "message" or absent), a
    `function_call`, a `function_call_output` or a `reasoning` item."""

    type: str | None = Field(
        default=None,
        description="message (default when `role` is given), function_call, "
        "function_call_output or reasoning.",
    )
    role: Literal["user", "system", "developer", "assistant"] | None = Field(
        default=None, description="A message's author."
    )
    content: str | list[ContentPart] | None = Field(
        default=None, description="A message's text, or its text parts (joined)."
    )
    id: str | None = Field(default=None, description="The item's id (accepted, not used).")
    call_id: str | None = Field(
        default=None, description="function_call / function_call_output: the call's id."
    )
    name: str | None = Field(default=None, description="function_call: the function called.")
    arguments: str | None = Field(
        default=None, description="function_call: the arguments, as JSON text."
    )
    output: str | list[ContentPart] | None = Field(
        default=None, description="function_call_output: the result (text, or text parts)."
    )
    summary: list[ContentPart] | None = Field(
        default=None, description="reasoning: accepted in histories, not shown to the model."
    )
    status: str | None = Field(default=None, description="Accepted and ignored.")


class FunctionTool(_Body):
    type: str = Field(description="function (built-in tools such as web_search are refused).")
    name: str | None = Field(
        default=None, description="The function's name: 1-64 letters, digits, '_' or '-'."
    )
    description: str | None = Field(default=None, description="What the function does.")
    parameters: dict[str, Any] | None = Field(
        default=None, description="JSON Schema of the arguments object (type object)."
    )
    strict: bool | None = Field(default=None, description="Accepted; schemas are always kept.")


class NamedFunction(_Body):
    type: str = Field(description='"function" (other kinds of tool_choice are refused).')
    name: str | None = Field(default=None, description="The function the answer must call.")


class TextFormat(_Body):
    type: Literal["text", "json_schema", "json_object"] = Field(
        description="text (free), json_schema (the answer is held to `schema`), or json_object."
    )
    name: str | None = Field(default=None, description="json_schema: the schema's name.")
    schema_: dict[str, Any] | None = Field(
        default=None, alias="schema", description="json_schema: the JSON Schema of the answer."
    )
    description: str | None = Field(default=None, description="Accepted and ignored.")
    strict: bool | None = Field(default=None, description="Accepted; the schema is enforced.")


class TextOptions(_Body):
    format: TextFormat | None = Field(default=None, description="The answer's format.")
    verbosity: str | None = Field(default=None, description="Accepted and ignored.")


class ReasoningOptions(_Body):
    effort: str | None = Field(
        default=None,
        description="Any value but none reads the model's <think> into reasoning items even "
        "when its chat template does not show it; the effort itself is not enforced.",
    )
    summary: str | None = Field(default=None, description="Accepted; no summaries are written.")


class ResponsesRequest(_Body):
    model: str | None = Field(default=None, description="A served model name (GET /v1/models).")
    input: str | list[InputItem] = Field(description="A user message's text, or input items.")
    instructions: str | None = Field(
        default=None,
        description="A system message before the input (not carried by previous_response_id).",
    )
    tools: list[FunctionTool] | None = Field(default=None, description="Function tools.")
    tool_choice: Literal["none", "auto", "required"] | NamedFunction | None = Field(
        default=None, description="How the model may use the tools (default auto)."
    )
    parallel_tool_calls: bool | None = Field(
        default=None, description="Several calls may come in one answer (default true)."
    )
    text: TextOptions | None = Field(default=None, description="The answer's format.")
    reasoning: ReasoningOptions | None = Field(default=None, description="Reasoning output.")
    max_output_tokens: int | None = Field(
        default=None, description="Most tokens to generate, reasoning included (>= 1)."
    )
    temperature: float | None = Field(
        default=None, description="Sampling temperature in [0, 2] (0: greedy); default 1."
    )
    top_p: float | None = Field(default=None, description="Nucleus sampling, in (0, 1].")
    stream: bool | None = Field(default=None, description="Stream typed server-sent events.")
    store: bool | None = Field(
        default=None,
        description="Keep the response for GET and previous_response_id (default true; kept in "
        "memory, the least recently used dropped beyond --responses-store-size).",
    )
    previous_response_id: str | None = Field(
        default=None,
        description="Continue a stored response: its input and output come before this input.",
    )
    metadata: dict[str, str] | None = Field(
        default=None, description="Up to 16 string pairs, returned with the response."
    )
    user: str | None = Field(default=None, description="Accepted and ignored.")
    truncation: Literal["auto", "disabled"] | None = Field(
        default=None, description="Accepted; a prompt too long for the context is a 400."
    )
    include: list[str] | None = Field(default=None, description="Accepted and ignored.")
    service_tier: str | None = Field(default=None, description="Accepted and ignored.")
    background: bool | None = Field(default=None, description="true is refused (400).")
    prompt: dict[str, Any] | None = Field(default=None, description="Refused (400).")
    conversation: Any | None = Field(default=None, description="Refused (400).")
    top_logprobs: int | None = Field(default=None, description="Refused (400) unless 0.")
