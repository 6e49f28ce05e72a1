"""Structured-output request shapes: OpenAI `response_format`, vLLM's `guided_*` fields, TGI's
`parameters.grammar`.

Contract: these pydantic models only describe the JSON (a wrong type is a 400 naming the field,
TGI: 422); server/openai/params.py and server/tgi/params.py map them onto `SamplingParams.structured_output`, and the engine
compiles the grammar (a schema it cannot compile is a 400 naming the field there too).
- `response_format` (chat): `{"type": "text"}` (no constraint), `{"type": "json_object"}`,
  `{"type": "json_schema", "json_schema": {"name", "schema", "strict", "description"}}`, and
  TGI's form `{"type": "json_object" | "json", "value": schema}` (what huggingface_hub's
  InferenceClient sends for a json_schema), read as that json_schema;
- `guided_json` (a schema, as an object or JSON text), `guided_regex`, `guided_choice` (a list
  of strings), `guided_grammar` (a Lark grammar, llguidance's dialect) on both OpenAI routes;
- TGI `grammar`: `{"type": "json", "value": schema}` or `{"type": "regex", "value": regex}`.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

_PERSON_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
    "required": ["name", "age"],
    "additionalProperties": False,
}


class JsonSchemaFormat(BaseModel):
    model_config = ConfigDict(extra="ignore", populate_by_name=True, use_attribute_docstrings=True)
    name: str | None = None
    """A name for the schema (accepted; not used)."""
    description: str | None = None
    """What the answer is (accepted; not used)."""
    schema_: dict[str, Any] | bool | None = Field(default=None, alias="schema")
    """The JSON Schema the answer must follow (generated compactly; a keyword the engine cannot
    enforce is refused)."""
    strict: bool | None = None
    """Accepted; the schema is always enforced strictly."""


class ResponseFormat(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
        use_attribute_docstrings=True,  # each field's docstring: its OpenAPI description
        json_schema_extra={
            "examples": [
                {"type": "json_object"},
                {
                    "type": "json_schema",
                    "json_schema": {"name": "person", "schema": _PERSON_SCHEMA},
                },
            ]
        },
    )
    type: Literal["text", "json_object", "json_schema"]
    """text: no constraint; json_object: any JSON object; json_schema: the schema in json_schema."""
    json_schema: JsonSchemaFormat | None = None
    """With type json_schema: the schema."""
    value: dict[str, Any] | bool | None = Field(
        default=None, description='TGI\'s form: {"type": "json_object", "value": schema}'
    )

    @model_validator(mode="before")
    @classmethod
    def _tgi_schema(cls, data: Any) -> Any:
        """TGI's `{"type": "json_object" | "json", "value": schema}` is that json_schema."""
        tgi = isinstance(data, dict) and data.get("type") in ("json_object", "json")
        if tgi and data.get("value") is not None:
            return {"type": "json_schema", "json_schema": {"schema": data["value"]}}
        return data


class GuidedFields(BaseModel):
    """vLLM's structured-output fields, on /v1/completions and /v1/chat/completions."""

    model_config = ConfigDict(use_attribute_docstrings=True)

    guided_json: dict[str, Any] | bool | str | None = None
    """vLLM's: the answer follows this JSON Schema (an object, or its JSON text)."""
    guided_regex: str | None = None
    """vLLM's: the answer matches this regular expression."""
    guided_choice: list[str] | None = None
    """vLLM's: the answer is exactly one of these strings."""
    guided_grammar: str | None = None
    """vLLM's: the answer follows this Lark grammar (llguidance's dialect)."""


class TgiGrammar(BaseModel):
    model_config = ConfigDict(
        extra="ignore",
        use_attribute_docstrings=True,  # each field's docstring: its OpenAPI description
        json_schema_extra={"examples": [{"type": "json", "value": _PERSON_SCHEMA}]},
    )
    type: Literal["json", "regex"]
    """json: value is a JSON Schema; regex: value is a regular expression."""
    value: dict[str, Any] | bool | str
    """The schema (object or JSON text) or the regular expression."""
