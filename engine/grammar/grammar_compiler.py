"""Compiling a request's `StructuredOutput` into a grammar the sampler can enforce, cached.

Contract: `GrammarCompiler(tokenizer, vocab_size, eos_token_ids, cache_size, cache_bytes)`;
`compile(structured_output)` returns a `CompiledGrammar` or raises `ValueError` naming what is
wrong ("invalid JSON schema: Unknown format: weird"), so `Engine.new_request` refuses the request
before any work. The message is llguidance's own, short, never a Rust panic or backtrace: a
grammar past llguidance's limits (`LIMITS`; e.g. more than ~65k alternatives in one rule) is
"too large to compile"; a choice list holds at most `MAX_CHOICES` strings. Compiled grammars
are kept in an LRU keyed by (kind, value), bounded by count and by bytes (grammar_cache.py;
`cache_bytes`, the server's `--grammar-cache-bytes`), and are shared: `CompiledGrammar.new_matcher()` hands each sequence a copy of its own.
`cache_bytes_held` is what the cache holds (a metric). Thread-safe: the server compiles on
worker threads (with a deadline) while the engine steps.

An entry's size is an estimate, `BYTES_PER_GRAMMAR_CHAR` per character of the grammar's
llguidance text plus a fixed part: llguidance reports no memory figure. The factor is the
largest resident-memory growth per character measured over choice lists, Lark alternations,
JSON-schema enums and objects and regex alternations of 2k-30k items (18-280 bytes per
character; objects with many properties cost most), rounded up.

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
from collections.abc import Sequence

import llguidance

from engine.grammar.grammar_cache import GrammarCache
from engine.grammar.grammar_tokenizer import grammar_tokenizer
from engine.requests.structured_output import StructuredOutput

DEFAULT_CACHE_SIZE = 256  # compiled grammars kept at most (each a few kB to ~100 MB)
DEFAULT_CACHE_BYTES = 512 * 1024 * 1024  # and their estimated bytes at most
BYTES_PER_GRAMMAR_CHAR = 300  # the size estimate (module docstring)
ENTRY_BASE_BYTES = 64 * 1024
# llguidance's own defaults, stated so they are ours; errors without the grammar's internals.
LIMITS = llguidance.LLParserLimits(
    max_items_in_row=2000,
    initial_lexer_fuel=1_000_000,
    step_lexer_fuel=200_000,
    step_max_items=50_000,
    max_lexer_states=250_000,
    max_grammar_size=500_000,
    verbose_errors=False,
)
# Choice lists past this are refused before compiling: llguidance gives up on a rule of ~65k
# alternatives only after compiling it (12 s for 100k on one core), and 20k take ~2 s.
MAX_CHOICES = 20_000
TOO_LARGE = "it is too large or complex to compile; use fewer alternatives or a smaller schema"
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

    def __init__(
        self, structured_output: StructuredOutput, matcher: llguidance.LLMatcher, size_bytes: int
    ) -> None:
        self.structured_output = structured_output
        self._pristine = matcher  # never advanced: only copied
        self.size_bytes = size_bytes  # an estimate (module docstring)

    def new_matcher(self) -> llguidance.LLMatcher:
        return self._pristine.deep_copy()


class GrammarCompiler:
    def __init__(
        self,
        tokenizer,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        cache_size: int = DEFAULT_CACHE_SIZE,
        cache_bytes: int = DEFAULT_CACHE_BYTES,
    ) -> None:
        self.vocab_size = vocab_size
        self.tokenizer = grammar_tokenizer(tokenizer, vocab_size, eos_token_ids)
        self._cache: GrammarCache[CompiledGrammar] = GrammarCache(cache_size, cache_bytes)
        self.num_compiled = 0  # cache misses, for tests and stats

    @property
    def cache_bytes_held(self) -> int:
        return self._cache.bytes_held

    def compile(self, structured_output: StructuredOutput) -> CompiledGrammar:
        key = (structured_output.kind, structured_output.value)
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        compiled = self._build(structured_output)
        self.num_compiled += 1
        self._cache.put(key, compiled, compiled.size_bytes)
        return compiled

    def _build(self, so: StructuredOutput) -> CompiledGrammar:
        what = _WHAT[so.kind]
        try:
            grammar = _grammar_text(so)
        except ValueError as exc:
            raise ValueError(_clean(str(exc), what)) from None
        # Builds the parser (the GIL is released meanwhile); errors put it in an error state.
        matcher = llguidance.LLMatcher(self.tokenizer, grammar, log_level=0, limits=LIMITS)
        if matcher.is_error():
            raise ValueError(_clean(f"invalid {what}: {matcher.get_error()}", what))
        size = ENTRY_BASE_BYTES + BYTES_PER_GRAMMAR_CHAR * len(grammar)
        return CompiledGrammar(so, matcher, size)


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
        choices = so.choices()
        if len(choices) > MAX_CHOICES:
            raise ValueError(f"invalid choice: {len(choices)} strings; at most {MAX_CHOICES}")
        alternatives = " | ".join(json.dumps(c, ensure_ascii=False) for c in choices)
        return llguidance.LLMatcher.grammar_from_lark(f"start: {alternatives}")
    if not so.value.strip():
        raise ValueError("invalid grammar: it is empty")
    return llguidance.LLMatcher.grammar_from_lark(so.value)


def _parse_schema(text: str) -> dict:
    try:
        schema = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ValueError(f"invalid JSON schema: not JSON ({exc})") from None
    except RecursionError:  # Python's parser gives up near 1000 levels
        raise ValueError("invalid JSON schema: it is nested too deeply") from None
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


def _clean(message: str, what: str, limit: int = 6) -> str:
    """A message fit for a client: llguidance's may carry a source excerpt (kept short) or, past
    an internal limit, a Rust panic and its backtrace (never shown: it says nothing a client
    can act on, and names the library's internals)."""
    if "panic" in message or "<backtrace>" in message:
        return f"invalid {what}: {TOO_LARGE}"
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return "\n".join(line[:500] for line in lines[:limit])
