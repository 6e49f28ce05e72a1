"""The JSON Schemas of tgserve's response bodies, each field described, for the OpenAPI document.

Contract: `OK` maps (path, method) to the 200 JSON body's schema; `ERRORS` gives each route
family's error body ("openai", "tgi", "anthropic"); `STATUS` is /health's and /ready's body.
Schemas say what the server promises, loosely where a body is open-ended (extra fields are
allowed everywhere); every property carries a description, with units where it has any
(tests/server/test_openapi_docs.py). server/openapi.py assembles them with the request bodies.
"""

from __future__ import annotations

from typing import Any


def field(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {**schema, "description": description}


def obj(required: list[str], **properties: dict[str, Any]) -> dict[str, Any]:
    return {"type": "object", "required": required, "properties": properties}


INT, STR, BOOL = {"type": "integer"}, {"type": "string"}, {"type": "boolean"}
NULL_STR, NULL_INT = {"type": ["string", "null"]}, {"type": ["integer", "null"]}
INTS = {"type": "array", "items": INT}

ERRORS = {
    "openai": obj(
        ["error"],
        error=field(
            obj(
                ["message", "type", "param", "code"],
                message=field(STR, "What went wrong and what to change."),
                type=field(STR, "The kind of error, e.g. invalid_request_error."),
                param=field(NULL_STR, "The request field (or header) at fault, if one is."),
                code=field(NULL_STR, "A stable code, e.g. overloaded, model_not_found."),
            ),
            "The error.",
        ),
    ),
    "tgi": obj(
        ["error", "error_type"],
        error=field(STR, "What went wrong and what to change."),
        error_type=field(STR, "The kind of error: validation, overloaded, generation, ..."),
    ),
    "anthropic": obj(
        ["type", "error"],
        type=field({"const": "error"}, "Always error."),
        error=field(
            obj(
                ["type", "message"],
                type=field(STR, "The kind of error, e.g. invalid_request_error."),
                message=field(STR, "What went wrong, opening with the field at fault."),
            ),
            "The error.",
        ),
    ),
}
STATUS = obj(["status"], status=field(STR, "ok / ready, or why not: unhealthy, loading, ..."))

_USAGE = obj(
    ["prompt_tokens", "completion_tokens", "total_tokens"],
    prompt_tokens=field(INT, "Tokens of the prompts (after the chat template), summed."),
    completion_tokens=field(INT, "Tokens generated, summed over the choices."),
    total_tokens=field(INT, "prompt_tokens + completion_tokens."),
)
_FINISH = field(
    {"type": ["string", "null"]},
    "Why the choice ended: stop (end of sequence or a stop string), length (max_tokens or the "
    "context), tool_calls, abort (deadline or shutdown), error; null while it goes on.",
)
_TOOL_CALL = obj(
    ["id", "type", "function"],
    id=field(STR, "The call's id, for the tool message that answers it."),
    type=field({"const": "function"}, "Always function."),
    function=field(
        obj(
            ["name", "arguments"],
            name=field(STR, "The function called."),
            arguments=field(STR, "Its arguments, JSON text of an object."),
        ),
        "The function and its arguments.",
    ),
)
_MESSAGE = obj(
    ["role", "content"],
    role=field({"const": "assistant"}, "Always assistant."),
    content=field(NULL_STR, "The answer's text (null when it is only tool calls)."),
    reasoning_content=field(NULL_STR, "A reasoning model's <think> text, apart from content."),
    tool_calls=field({"type": "array", "items": _TOOL_CALL}, "The calls the model made."),
)


def _completion(choice_key: str) -> dict[str, Any]:
    choice = obj(
        ["index", "finish_reason"],
        index=field(INT, "The choice: prompt index * n + sample index."),
        finish_reason=_FINISH,
    )
    what = "The answer." if choice_key == "message" else "The generated text."
    choice["properties"][choice_key] = field(_MESSAGE if choice_key == "message" else STR, what)
    return obj(
        ["id", "object", "created", "model", "choices", "usage"],
        id=field(STR, "The request's id, as the engine and the logs name it."),
        object=field(STR, "text_completion or chat.completion."),
        created=field(INT, "When the request arrived, in seconds since the Unix epoch."),
        model=field(STR, "The served model's name."),
        choices=field({"type": "array", "items": choice}, "One per prompt and sample."),
        usage=field(_USAGE, "Token counts."),
    )


_TGI_GENERATED = obj(
    ["generated_text"],
    generated_text=field(STR, "The text generated (after the input with return_full_text)."),
    details=field(
        {"type": "object"},
        "With parameters.details: finish_reason, generated_tokens, seed, prefill, tokens, "
        "top_tokens, best_of_sequences.",
    ),
)
_MODEL_CARD = obj(
    ["id", "object", "owned_by"],
    id=field(STR, "The model's name, as requests give it in `model`."),
    object=field(STR, "Always model."),
    created=field(INT, "When the server started, in seconds since the Unix epoch."),
    owned_by=field(STR, "Always tgserve."),
    max_model_len=field(INT, "Tokens a request may hold, prompt and output together."),
    token_ids_only=field(BOOL, "The model has no usable tokenizer: prompts must be token ids."),
)
_RESPONSE = obj(
    ["id", "object", "created_at", "status", "model", "output"],
    id=field(STR, "The response's id (resp_...), for retrieval and previous_response_id."),
    object=field({"const": "response"}, "Always response."),
    created_at=field(INT, "When the request arrived, in seconds since the Unix epoch."),
    status=field(
        STR, "completed, or incomplete (max_output_tokens reached); in_progress in streams."
    ),
    model=field(STR, "The served model's name."),
    output=field(
        {"type": "array", "items": obj(["type"], type=field(STR, "message, reasoning, ..."))},
        "The output items: messages, reasoning, function calls.",
    ),
)
_ANTHROPIC_MESSAGE = obj(
    ["id", "type", "role", "model", "content", "stop_reason", "usage"],
    id=field(STR, "The message's id (msg_...), as the engine and the logs name the request."),
    type=field({"const": "message"}, "Always message."),
    role=field({"const": "assistant"}, "Always assistant."),
    model=field(STR, "The served model's name."),
    content=field(
        {"type": "array", "items": obj(["type"], type=field(STR, "text, thinking, tool_use."))},
        "The answer's blocks.",
    ),
    stop_reason=field(NULL_STR, "end_turn, max_tokens, stop_sequence or tool_use."),
    stop_sequence=field(NULL_STR, "The stop sequence that ended it, if one did."),
    usage=field(
        obj(
            ["input_tokens", "output_tokens"],
            input_tokens=field(INT, "Tokens of the rendered prompt."),
            output_tokens=field(INT, "Tokens generated."),
        ),
        "Token counts.",
    ),
)

OK: dict[tuple[str, str], dict[str, Any]] = {
    ("/v1/completions", "post"): _completion("text"),
    ("/v1/chat/completions", "post"): _completion("message"),
    ("/v1/models", "get"): obj(
        ["object", "data"],
        object=field(STR, "Always list."),
        data=field(
            {"type": "array", "items": _MODEL_CARD}, "The served model (one entry per name)."
        ),
    ),
    ("/v1/models/{model_id}", "get"): _MODEL_CARD,
    ("/tokenize", "post"): obj(
        ["tokens", "count", "max_model_len"],
        tokens=field(INTS, "The token ids."),
        count=field(INT, "How many tokens."),
        max_model_len=field(INT, "Tokens a request may hold, prompt and output together."),
    ),
    ("/detokenize", "post"): obj(["prompt"], prompt=field(STR, "The text of the token ids.")),
    ("/v1/messages", "post"): _ANTHROPIC_MESSAGE,
    ("/v1/messages/count_tokens", "post"): obj(
        ["input_tokens"], input_tokens=field(INT, "Tokens of the rendered prompt.")
    ),
    ("/v1/responses", "post"): _RESPONSE,
    ("/v1/responses/{response_id}", "get"): _RESPONSE,
    ("/v1/responses/{response_id}", "delete"): obj(
        ["id", "object", "deleted"],
        id=field(STR, "The deleted response's id."),
        object=field(STR, "Always response.deleted."),
        deleted=field(BOOL, "Always true."),
    ),
    ("/generate", "post"): _TGI_GENERATED,
    ("/", "post"): {"type": "array", "items": _TGI_GENERATED},
    ("/info", "get"): obj(
        ["model_id", "max_total_tokens", "max_input_tokens"],
        model_id=field(NULL_STR, "The served model's name."),
        max_total_tokens=field(INT, "Tokens a request may hold, input and output together."),
        max_input_tokens=field(INT, "Tokens an input may hold (max_total_tokens - 1)."),
        vocab_size=field(NULL_INT, "Token ids run from 0 to vocab_size - 1."),
    ),
    ("/health", "get"): STATUS,
    ("/ready", "get"): STATUS,
    ("/version", "get"): obj(["version"], version=field(STR, "tgserve's version.")),
}
EVENT = obj(  # one server-sent event of a stream
    ["data"],
    event=field(STR, "The event's type (its `event:` line; Anthropic and Responses streams)."),
    data=field(STR, "The event's JSON (a chunk); OpenAI-style streams end with [DONE]."),
)
