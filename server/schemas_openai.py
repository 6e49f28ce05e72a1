"""OpenAI API shapes: request bodies (pydantic) and response / chunk / logprobs builders.

Contract: request models only describe the JSON (types, defaults, unknown fields ignored);
mapping them to SamplingParams happens in schemas.py. Builders return plain JSON-ready dicts
in the OpenAI API's shapes: completions logprobs `{tokens, token_logprobs, top_logprobs,
text_offset}`, chat logprobs `{content: [{token, logprob, bytes, top_logprobs}]}`, usage
`{prompt_tokens, completion_tokens, total_tokens}`. Token strings follow OpenAI's convention for
a token that is not valid UTF-8 on its own: "bytes:\\xNN...". Logprobs of -inf are clamped to
-9999.0 because JSON has no infinity.
"""

from __future__ import annotations

import codecs
import math
from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from engine import TokenLogprob
from server.schemas_structured import GuidedFields, ResponseFormat

MIN_LOGPROB = -9999.0


class _Body(BaseModel):
    model_config = ConfigDict(extra="ignore")


class StreamOptions(_Body):
    include_usage: bool | None = None


class FaultFields(BaseModel):
    """Tests only (--enable-fault-injection): exactly one of these, counted in generated tokens;
    see engine/faults.py. Unknown keys are refused, so a typo never passes silently."""

    model_config = ConfigDict(extra="forbid")
    fail_after_tokens: int | None = None
    kill_engine_after_tokens: int | None = None


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


def clamp(logprob: float | None) -> float | None:
    if logprob is None:
        return None
    return logprob if math.isfinite(logprob) else MIN_LOGPROB


class TokenTexts:
    """Token id -> the string and bytes OpenAI shows for it (cached per server)."""

    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        self._cache: dict[int, tuple[str, bytes]] = {}

    def get(self, token_id: int) -> tuple[str, bytes]:
        if token_id not in self._cache:
            raw = self._tokenizer.token_bytes(token_id)
            if not raw and self._tokenizer.is_special(token_id):
                raw = self._tokenizer.decode([token_id], skip_special_tokens=False).encode()
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError:
                text = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self._cache[token_id] = (text, raw)
        return self._cache[token_id]


class CompletionLogprobs:
    """Legacy completions logprobs of one choice; text_offset keeps counting across chunks."""

    def __init__(self, texts: TokenTexts) -> None:
        self._texts = texts
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._chars = 0

    def render(
        self, entries: Sequence[TokenLogprob | None], token_ids: Sequence[int]
    ) -> dict[str, Any]:
        """`entries[i]` scores `token_ids[i]` (None for the first prompt token)."""
        tokens, token_logprobs, tops, offsets = [], [], [], []
        for token_id, entry in zip(token_ids, entries, strict=True):
            text, raw = self._texts.get(token_id)
            tokens.append(text)
            offsets.append(self._chars)
            self._chars += len(self._decoder.decode(raw))
            token_logprobs.append(clamp(entry.logprob) if entry else None)
            if entry is None:
                tops.append(None)
                continue
            top = {self._texts.get(t)[0]: clamp(lp) for t, lp in entry.top}
            if entry.top:  # OpenAI lists the chosen token too
                top.setdefault(text, clamp(entry.logprob))
            tops.append(top)
        return {
            "tokens": tokens,
            "token_logprobs": token_logprobs,
            "top_logprobs": tops,
            "text_offset": offsets,
        }


def chat_logprobs(texts: TokenTexts, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
    def item(token_id: int, logprob: float) -> dict[str, Any]:
        text, raw = texts.get(token_id)
        return {"token": text, "logprob": clamp(logprob), "bytes": list(raw)}

    content = [
        {**item(e.token_id, e.logprob), "top_logprobs": [item(t, lp) for t, lp in e.top]}
        for e in entries
    ]
    return {"content": content, "refusal": None}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {
        "prompt_tokens": prompt_tokens,
        "completion_tokens": completion_tokens,
        "total_tokens": prompt_tokens + completion_tokens,
    }


def response_body(
    kind: Literal["text_completion", "chat.completion"],
    request_id: str,
    created: int,
    model: str,
    choices: list[dict[str, Any]],
    usage_: dict[str, int] | None,
    chunk: bool,
) -> dict[str, Any]:
    """A whole response (usage always present) or one stream chunk (usage only when given)."""
    body: dict[str, Any] = {
        "id": request_id,
        "object": kind + ".chunk" if chunk and kind == "chat.completion" else kind,
        "created": created,
        "model": model,
        "choices": choices,
        "system_fingerprint": None,
    }
    if usage_ is not None or not chunk:
        body["usage"] = usage_
    return body
