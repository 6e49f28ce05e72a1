"""StructuredOutput: the constraint a request puts on its output (the engine-side request form).

Contract: a frozen value, part of `SamplingParams.structured_output`. `kind` says how `value`
reads:
- "json_schema": `value` is a JSON Schema document (JSON text);
- "json_object": any JSON object; `value` is ignored ("" by convention);
- "regex": `value` is a regular expression the whole output must match;
- "choice": `value` is a JSON list of strings; the output is exactly one of them;
- "grammar": `value` is a Lark grammar in llguidance's dialect (it may embed `%json {schema}`).
Construction checks only the shape (a known kind, a string value, a choice list of strings);
whether the grammar compiles is checked by the engine at request validation
(`Engine.new_request`), which raises `ValueError` naming the problem, so the server answers
400 before any stream byte.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Literal, get_args

StructuredKind = Literal["json_schema", "json_object", "regex", "choice", "grammar"]
STRUCTURED_KINDS: tuple[str, ...] = get_args(StructuredKind)
MAX_STRUCTURED_VALUE_CHARS = 1 << 20  # a constraint larger than 1 MiB of text is refused


@dataclass(frozen=True)
class StructuredOutput:
    kind: StructuredKind
    value: str = ""

    def __post_init__(self) -> None:
        if self.kind not in STRUCTURED_KINDS:
            raise ValueError(
                f"structured_output kind must be one of {', '.join(STRUCTURED_KINDS)}, got {self.kind!r}"
            )
        if not isinstance(self.value, str):
            raise ValueError(
                f"structured_output value must be a string, got {type(self.value).__name__}"
            )
        if len(self.value) > MAX_STRUCTURED_VALUE_CHARS:
            raise ValueError(
                f"structured_output {self.kind} is longer than {MAX_STRUCTURED_VALUE_CHARS} characters"
            )
        if self.kind == "choice":
            self.choices()  # checks the list's shape now

    @classmethod
    def from_choices(cls, choices: list[str] | tuple[str, ...]) -> StructuredOutput:
        return cls("choice", json.dumps(list(choices)))

    @classmethod
    def from_schema(cls, schema: dict | bool) -> StructuredOutput:
        return cls("json_schema", json.dumps(schema))

    def choices(self) -> list[str]:
        """The choice list (kind "choice" only); ValueError when it is not a non-empty list of
        strings."""
        try:
            choices = json.loads(self.value)
        except json.JSONDecodeError as exc:
            raise ValueError(f"choice must be a JSON list of strings: {exc}") from None
        if (
            not isinstance(choices, list)
            or not choices
            or not all(isinstance(c, str) for c in choices)
        ):
            raise ValueError("choice must be a non-empty list of strings")
        return choices
