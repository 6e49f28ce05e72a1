"""ChatTemplate: a model's jinja2 chat template, rendered the way transformers renders it.

Contract: `ChatTemplate(source, special_tokens).render(messages, add_generation_prompt, **kwargs)`
returns the prompt text. The template runs in jinja2's ImmutableSandboxedEnvironment (templates
come from model files: untrusted code) with transformers' settings: trim_blocks, lstrip_blocks,
loop controls, `raise_exception`, `strftime_now`, a `tojson` that keeps non-ASCII text, and
`{% generation %}` blocks rendered as plain text. Template variables are `messages`,
`add_generation_prompt`, `tools`, `documents`, the special-token strings (`bos_token`,
`eos_token`, ...) and any keyword argument. A template that does not compile, or that calls
`raise_exception` (e.g. "roles must alternate"), raises ValueError with the template's message.
`uses(name)` says whether the template reads a variable (e.g. `tools`: it renders tool specs).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from datetime import datetime
from typing import Any

import jinja2
import jinja2.ext
import jinja2.meta
import jinja2.nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment

__all__ = ["ChatTemplate"]


class _GenerationBlock(jinja2.ext.Extension):
    """`{% generation %}...{% endgeneration %}` marks assistant text for training masks in
    transformers; for serving only its body matters, so it renders the body unchanged."""

    tags = {"generation"}

    def parse(self, parser: Any) -> list[jinja2.nodes.Node]:
        next(parser.stream)  # the `generation` tag itself
        return parser.parse_statements(("name:endgeneration",), drop_needle=True)


def _raise_exception(message: str) -> None:
    raise jinja2.exceptions.TemplateError(message)


def _tojson(
    value: Any,
    ensure_ascii: bool = False,
    indent: int | None = None,
    separators: tuple[str, str] | None = None,
    sort_keys: bool = False,
) -> str:
    # jinja2's own tojson escapes <, >, & and ' for HTML; prompts need the JSON text itself.
    return json.dumps(
        value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys
    )


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


class ChatTemplate:
    def __init__(self, source: str, special_tokens: Mapping[str, str]) -> None:
        self.source = source
        self._special_tokens = dict(special_tokens)  # e.g. {"bos_token": "<s>", ...}
        self._compiled: jinja2.Template | None = None

    @staticmethod
    def _environment() -> ImmutableSandboxedEnvironment:
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True,
            lstrip_blocks=True,
            extensions=[_GenerationBlock, jinja2.ext.loopcontrols],
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        return env

    def _template(self) -> jinja2.Template:
        # Compiled on first use, so a model with a broken template still loads for plain prompts.
        if self._compiled is None:
            try:
                self._compiled = self._environment().from_string(self.source)
            except jinja2.TemplateSyntaxError as exc:
                raise ValueError(f"the model's chat template does not compile: {exc}") from exc
        return self._compiled

    def uses(self, name: str) -> bool:
        """Whether the template reads the variable `name` (False when it does not compile)."""
        try:
            ast = self._environment().parse(self.source)
        except jinja2.TemplateSyntaxError:
            return False
        return name in jinja2.meta.find_undeclared_variables(ast)

    def render(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        if not isinstance(messages, list) or not all(isinstance(m, dict) for m in messages):
            raise ValueError("messages must be a list of dicts like {'role': ..., 'content': ...}")
        variables: dict[str, Any] = {"tools": None, "documents": None, **self._special_tokens}
        variables.update(kwargs)
        try:
            return self._template().render(
                messages=messages, add_generation_prompt=add_generation_prompt, **variables
            )
        except jinja2.TemplateError as exc:
            raise ValueError(f"chat template error: {exc}") from exc
