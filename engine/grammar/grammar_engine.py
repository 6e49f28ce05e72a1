"""GrammarEngine: the engine's one door to structured outputs.

Contract: `GrammarEngine.for_tokenizer(tokenizer, vocab_size, eos_token_ids, cache_bytes)` (None
when the model has no tokenizer with raw token bytes: such an engine refuses structured outputs).
- `compile(params)`: the request's `CompiledGrammar` (cached), None without a constraint, or
  `ValueError` naming the problem — `Engine.new_request` calls it to validate, `Engine.add` to
  get the grammar (a cache hit).
- `cache_bytes_held`: the estimated bytes of the compiled grammars kept (at most `cache_bytes`).
- `start_masks(jobs, failed)`: begins computing the step's masks on the worker thread (see
  grammar_masker.py) for `(logits_row, matcher)` pairs; the pending mask goes to the runner
  with the step's inputs, and its `.result()` (after the forward) is the step's `HostMask`
  (`failed`: rows whose matcher raised already, named in it).
- `close()`: stops the worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence

import llguidance

from engine.grammar.grammar_compiler import (
    DEFAULT_CACHE_BYTES,
    DEFAULT_CACHE_SIZE,
    CompiledGrammar,
    GrammarCompiler,
)
from engine.grammar.grammar_masker import GrammarMasker, PendingMask
from engine.requests.sampling_params import SamplingParams

NO_TOKENIZER = "structured outputs need the model's tokenizer, and this model has none"


class GrammarEngine:
    def __init__(self, compiler: GrammarCompiler) -> None:
        self.compiler = compiler
        self._masker = GrammarMasker(compiler.vocab_size)

    @classmethod
    def for_tokenizer(
        cls,
        tokenizer,
        vocab_size: int,
        eos_token_ids: Sequence[int],
        cache_bytes: int = DEFAULT_CACHE_BYTES,
        cache_size: int = DEFAULT_CACHE_SIZE,
    ) -> GrammarEngine | None:
        if tokenizer is None or not hasattr(tokenizer, "token_bytes") or not eos_token_ids:
            return None
        compiler = GrammarCompiler(tokenizer, vocab_size, eos_token_ids, cache_size, cache_bytes)
        return cls(compiler)

    @property
    def cache_bytes_held(self) -> int:
        return self.compiler.cache_bytes_held

    def compile(self, params: SamplingParams) -> CompiledGrammar | None:
        if params.structured_output is None:
            return None
        return self.compiler.compile(params.structured_output)

    def start_masks(
        self, jobs: Sequence[tuple[int, llguidance.LLMatcher]], failed: Sequence[int] = ()
    ) -> PendingMask:
        return self._masker.start(jobs, failed)

    def close(self) -> None:
        self._masker.close()
