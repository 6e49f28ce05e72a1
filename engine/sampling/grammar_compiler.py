"""Compiling a request's `StructuredOutput` into a grammar the sampler can enforce, cached.

Contract: `GrammarCompiler(tokenizer, vocab_size, eos_token_ids, cache_size)`;
`compile(structured_output)` returns a `CompiledGrammar` or raises `ValueError` naming what is
wrong ("invalid JSON schema: Unknown format: weird"), so `Engine.new_request` refuses the request
before any work. Compiled grammars are kept in a bounded LRU keyed by (kind, value) and are
shared: `CompiledGrammar.new_matcher()` hands each sequence a copy of its own. Thread-safe:
the server may validate requests on any thread while the engine steps.

The grammar engine is llguidance, chosen by measuring it against xgrammar on SmolLM2's
49,152-token vocabulary (one core, see the issue #16 note for the script and numbers):
- compile (+ first mask) of three JSON schemas: llguidance 0.7-1.0 ms, xgrammar 7-10 ms — the
  cost a new schema adds to its first token; both are far under the 50 ms target, llguidance by
  an order of magnitude more;
- mask per token: xgrammar ~1-3 us median (it precomputes masks at compile time), llguidance
  5-40 us median, ~0.1-0.5 ms worst; a step of 64 rows costs llguidance ~1-2 ms, computed on a
  worker thread while the forward runs, so it is hidden either way;
- llguidance is a self-contained wheel with no dependencies; xgrammar requires torch,
  transformers and triton at run time (transformers is a test-only dependency here);
- llguidance reads Lark grammars with embedded `%json {schema}`, which tool calling builds on.
Schemas are compiled strictly: a keyword llguidance cannot enforce is an error (400), never
silently ignored. JSON is generated compactly but with the usual ", " / ": " separators and no
free whitespace, so a small model cannot wander off into endless newlines.
"""

from __future__ import annotations

import json
import threading
from collections import OrderedDict
from collections.abc import Sequence

import llguidance

from engine.requests.structured_output import StructuredOutput
from engine.sampling.grammar_tokenizer import grammar_tokenizer

DEFAULT_CACHE_SIZE = 256  # compiled grammars kept (each a few kB to a few MB)
_JSON_OPTIONS = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
    "lenient": False,
}
_WHAT = {
    "json_schema": "JSON schema",
    "json_object": "JSON object grammar",
    "regex": "regex",
    "choice": "choice",
    "grammar": "grammar",
}


class CompiledGrammar:
    """A compiled grammar: immutable once built; hands out fresh matchers."""

    def __init__(self, structured_output: StructuredOutput, matcher: llguidance.LLMatcher) -> None:
        self.structured_output = structured_output
        self._pristine = matcher  # never advanced: only copied

    def new_matcher(self) -> llguidance.LLMatcher:
        return self._pristine.deep_copy()


class GrammarCompiler:
    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> None:
        if cache_size < 1:
            raise ValueError(f"cache_size must be at least 1, got {cache_size}")
        self.vocab_size = vocab_size
        self.tokenizer = grammar_tokenizer(tokenizer, vocab_size, eos_token_ids)
        self.cache_size = cache_size
        self._cache: OrderedDict[tuple[str, str], CompiledGrammar] = OrderedDict()
        self._lock = threading.Lock()
        self.num_compiled = 0  # cache misses, for tests and stats

    def compile(self, structured_output: StructuredOutput) -> CompiledGrammar:
        key = (structured_output.kind, structured_output.value)
        with self._lock:
            hit = self._cache.get(key)
            if hit is not None:
                self._cache.move_to_end(key)
                return hit
        compiled = CompiledGrammar(structured_output, self._build(structured_output))
        with self._lock:
            self.num_compiled += 1
            self._cache[key] = compiled
            self._cache.move_to_end(key)
            while len(self._cache) > self.cache_size:
                self._cache.popitem(last=False)
        return compiled

    def _build(self, so: StructuredOutput) -> llguidance.LLMatcher:
        grammar = _grammar_text(so)
        # Builds the parser (the GIL is released meanwhile); errors put it in an error state.
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0)
        if matcher.is_error():
            raise ValueError(f"invalid {_WHAT[so.kind]}: {_first_lines(matcher.get_error())}")
        return matcher


def _grammar_text(so: StructuredOutput) -> str:
    """The llguidance grammar (its JSON form, or Lark) of a structured output."""
    if so.kind == "json_schema":
        return _from_schema(_parse_schema(so.value))
    if so.kind == "json_object":
        return _from_schema({"type": "object"})
    if so.kind == "regex":
        if not so.value:
            raise ValueError("invalid regex: it is empty")
        return llguidance.LLMatcher.grammar_from_regex(so.value)
    if so.kind == "choice":
        # JSON string escapes are valid Lark string escapes (checked in the tests).
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in so.choices())
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
    if not so.value.strip():
        raise ValueError("invalid grammar: it is empty")
    return llguidance.LLMatcher.grammar_from_lark(so.value)


def _parse_schema(text: str) -> dict:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON schema: not JSON ({exc})") from None
    if schema is True:
        return {}
    if schema is False:
        raise ValueError("invalid JSON schema: the schema `false` accepts nothing")
    if not isinstance(schema, dict):
        raise ValueError(f"invalid JSON schema: must be an object, got {type(schema).__name__}")
    return schema


def _from_schema(schema: dict) -> str:
    try:
        return llguidance.LLMatcher.grammar_from_json_schema(schema, defaults=_JSON_OPTIONS)
    except ValueError as exc:
        raise ValueError(f"invalid JSON schema: {exc}") from None


def _first_lines(message: str, limit: int = 6) -> str:
    """llguidance errors may carry a source excerpt; keep the message short."""
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return "\n".join(lines[:limit])
