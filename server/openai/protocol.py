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
    # Each field's docstring is its description in the OpenAPI document (server/openapi.py).
    model_config = ConfigDict(extra="ignore", use_attribute_docstrings=True)


class StreamOptions(_Body):
    include_usage: bool | None = None
    """Streams only: send a last chunk with `choices: []` and `usage` (token counts)."""


class SamplingFields(_Body, GuidedFields):
    """Fields shared by /v1/completions and /v1/chat/completions (None: the default)."""

    model: str | None = None
    """A served model name (see /v1/models); unset, `dummy` or `tgi`: the served model. Another
    name is a 404."""
    n: int | None = None
    """Choices to return per prompt, 1 to 16 (default 1); each is a sequence in the batch."""
    best_of: int | None = None
    """Sequences to generate per prompt, n to 16, of which the n with the highest mean log
    probability are returned (default: n)."""
    temperature: float | None = None
    """Sampling temperature in [0, 100]; 0 (below 1e-5) is greedy. Default 1 (chat: the model's
    generation_config.json when it sets one)."""
    top_p: float | None = None
    """Nucleus sampling: the smallest set of tokens whose probabilities sum to at least this, in
    (0, 1] (default 1: off)."""
    top_k: int | None = None
    """Sample among the k most likely tokens; -1 or 0: off (default)."""
    min_p: float | None = None
    """Drop tokens whose probability is below min_p times the most likely one's, in [0, 1] (default
    0: off)."""
    presence_penalty: float | None = None
    """Subtracted once from the logit of every token already generated, in [-2, 2] (default 0)."""
    frequency_penalty: float | None = None
    """Subtracted from a token's logit per time it was generated, in [-2, 2] (default 0)."""
    repetition_penalty: float | None = None
    """Divides positive (multiplies negative) logits of tokens in the prompt or output, as
    transformers does; in [0.01, 100], 1 is off (default)."""
    logit_bias: dict[str, float] | None = None
    """Token id (as a string) -> a bias in [-100, 100] added to its logit; at most 300 entries."""
    seed: int | None = None
    """In [0, 2**63): a seeded request gets the same tokens whatever else runs beside it."""
    stop: str | list[str] | None = None
    """Up to 16 strings (1 to 256 characters each) that end the generation; the text is cut before
    them."""
    stop_token_ids: list[int] | None = None
    """Token ids that end the generation, beside the model's end-of-sequence tokens."""
    ignore_eos: bool | None = None
    """Keep generating past end-of-sequence tokens, up to max_tokens (default false)."""
    min_tokens: int | None = None
    """Tokens generated before end-of-sequence or stop ids may end the answer, >= 0 (default 0)."""
    use_beam_search: bool | None = None
    """Beam search of width best_of (or the model's num_beams) instead of sampling (default false)."""
    length_penalty: float | None = None
    """Beam search: score = sum of log probabilities / length ** length_penalty, in [-10, 10]
    (default 1)."""
    include_stop_str_in_output: bool | None = None
    """Keep the matched stop string at the end of the text (default false)."""
    skip_special_tokens: bool | None = None
    """Leave special tokens out of the text (default true)."""
    stream: bool | None = None
    """Answer as server-sent events (`data: {chunk}` ... `data: [DONE]`) as tokens are generated
    (default false)."""
    stream_options: StreamOptions | None = None
    """Streaming options."""
    user: str | None = None
    """An end-user id; accepted and ignored."""
    timeout: float | None = None
    """Seconds, > 0: the request is aborted after this, queued or running (finish_reason abort);
    the smaller of this and --request-timeout applies."""
    priority: int | None = None
    """An integer in [-2**31, 2**31): lower runs first (default 0); below 0 only for keys listed in
    --priority-keys."""
    fault: FaultFields | None = None
    """Tests only, with --enable-fault-injection: fail this request or kill the engine after some
    tokens."""


class CompletionRequest(SamplingFields):
    prompt: str | list[str] | list[int] | list[list[int]]
    """The prompt: a string, a list of strings (one request each), token ids, or lists of token
    ids."""
    max_tokens: int | None = 16
    """Tokens to generate at most, >= 1 (default 16); null: up to the context's end."""
    logprobs: int | None = None
    """Return the log probabilities of each generated token and of this many most likely ones, 0 to
    20."""
    echo: bool | None = None
    """Prepend the prompt to the text (with logprobs: the prompt's log probabilities too)."""
    suffix: str | None = None
    """Accepted for compatibility; a suffix other than null or empty is refused (no insertion
    mode)."""


class TextPart(_Body):
    type: Literal["text"]
    """A text part."""
    text: str
    """The text."""


class FunctionCall(_Body):
    name: str
    """The function called."""
    arguments: str
    """The arguments, as JSON text of an object."""


class ToolCallItem(_Body):
    """A call the assistant made (in a history message, or in a response)."""

    id: str | None = None
    """The call's id, answered by a tool message's tool_call_id."""
    type: Literal["function"] = "function"
    """Always function."""
    function: FunctionCall
    """The function and its arguments."""


class FunctionDefinition(_Body):
    name: str
    """The function's name, as the model will call it."""
    description: str | None = None
    """What the function does, shown to the model."""
    parameters: dict[str, Any] | None = None
    """A JSON Schema of the arguments object; with tool_choice required or a named function, the
    arguments are generated to match it."""
    strict: bool | None = None
    """Accepted; arguments are always held to the schema when a grammar enforces the call."""


class ToolDefinition(_Body):
    type: Literal["function"]
    """Always function."""
    function: FunctionDefinition
    """The function offered to the model."""


class NamedFunction(_Body):
    name: str
    """The function the model must call."""


class NamedToolChoice(_Body):
    type: Literal["function"]
    """Always function."""
    function: NamedFunction
    """The function the model must call."""


class ChatMessage(_Body):
    role: Literal["system", "developer", "user", "assistant", "tool"]
    """Who speaks: system / developer (instructions), user, assistant, or tool (a call's result)."""
    content: str | list[TextPart] | None = None
    """The message text, or a list of text parts (joined)."""
    name: str | None = None
    """A name for the speaker, passed to the chat template."""
    tool_calls: list[ToolCallItem] | None = None
    """Assistant messages: the calls it made."""
    tool_call_id: str | None = None
    """Tool messages: the id of the call this answers."""
    reasoning_content: str | None = None
    """Accepted so answers can be sent back as they came; not shown to the model."""

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
    """The conversation, rendered with the model's chat template."""
    max_tokens: int | None = None
    """Tokens to generate at most, >= 1 (default: up to the context's end, within
    generation_config.json's bound)."""
    max_completion_tokens: int | None = None
    """OpenAI's newer name of max_tokens; wins when both are given."""
    logprobs: bool | None = None
    """Return the log probability of each generated token (default false)."""
    top_logprobs: int | None = None
    """With logprobs: also the this many most likely tokens at each position, 0 to 20."""
    add_generation_prompt: bool | None = None
    """End the rendered prompt with the assistant turn's opening (default true)."""
    response_format: ResponseFormat | None = None
    """Constrain the answer: text (none), json_object (any JSON object) or json_schema (that
    schema, always enforced)."""
    tools: list[ToolDefinition] | None = None
    """Functions the model may call (answers then carry tool_calls)."""
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    """none, auto (default with tools), required (at least one call, enforced), or a named function
    (that call, enforced)."""
    parallel_tool_calls: bool | None = None
    """Allow several calls in one answer (default true); false: at most one."""
    reasoning_effort: Literal["low", "medium", "high"] | None = None
    """How hard a reasoning model thinks (gpt-oss's harmony format: its system message's
    `Reasoning:` line; default medium); other models ignore it."""


class TokenizeRequest(_Body):
    """vLLM-style /tokenize: a prompt, or chat messages rendered through the chat template."""

    model: str | None = None
    """A served model name (see /v1/models); unset: the served model."""
    prompt: str | None = None
    """Text to tokenize (give this or messages)."""
    messages: list[ChatMessage] | None = None
    """Chat messages, rendered with the chat template and then tokenized (give this or prompt)."""
    add_special_tokens: bool | None = None
    """With prompt: add the tokenizer's special tokens, such as BOS (default true)."""
    add_generation_prompt: bool | None = None
    """With messages: end with the assistant turn's opening (default true)."""


class DetokenizeRequest(_Body):
    model: str | None = None
    """A served model name (see /v1/models); unset: the served model."""
    tokens: list[int]
    """Token ids to turn into text, each in [0, vocabulary size)."""
