"""The grammar state of one request: one llguidance matcher per sequence.

Contract: `SequenceMatchers(compiled)` (a `CompiledGrammar` from grammar_compiler.py). Each
sequence's matcher remembers how many of its output tokens it has consumed and catches up on
use, so the engine only says which sequence moved:
- `matcher(seq)`: the matcher of `seq`, fed all of `seq`'s output tokens; made on first use
  from a fresh copy of the grammar (n > 1 children, forked before their first token, start so);
- `fork(parent, child)`: `child` gets a copy of `parent`'s matcher as it is now — beam search
  forks before the new tokens are fed;
- `advance(seq)` after a token was appended: feeds it; True when the grammar is over — it is
  complete and allows nothing more (the engine then ends the sequence with finish_reason
  "stop"), or the token broke it (only when other constraints of the request left the grammar
  no allowed token; ending the sequence is the one safe answer);
- `follow_beams(moved, live)` after a beam-search step: forks, feeds, forgets dropped beams.
Matchers are only touched on the engine's thread, never while the step's masks are computed.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable, Sequence

import llguidance

from engine.grammar.grammar_compiler import CompiledGrammar
from engine.requests.request import TokenSequence

log = logging.getLogger("tgserve.engine")


class SequenceMatchers:
    def __init__(self, compiled: CompiledGrammar) -> None:
        self.compiled = compiled
        self._matchers: dict[int, tuple[llguidance.LLMatcher, int]] = {}  # seq_id -> (m, fed)
        self._broken: set[int] = set()

    def matcher(self, seq: TokenSequence) -> llguidance.LLMatcher:
        matcher, fed = self._matchers.get(seq.seq_id) or (self.compiled.new_matcher(), 0)
        if fed < seq.num_output_tokens:
            new = seq.token_ids[seq.num_prompt_tokens + fed :]
            if not matcher.consume_tokens(new) and seq.seq_id not in self._broken:
                self._broken.add(seq.seq_id)
                log.warning("sequence %d broke its grammar: %s", seq.seq_id, matcher.get_error())
        self._matchers[seq.seq_id] = (matcher, seq.num_output_tokens)
        return matcher

    def fork(self, parent: TokenSequence, child: TokenSequence) -> None:
        matcher, fed = self._matchers.get(parent.seq_id) or (self.compiled.new_matcher(), 0)
        self._matchers[child.seq_id] = (matcher.deep_copy(), fed)

    def advance(self, seq: TokenSequence) -> bool:
        matcher = self.matcher(seq)
        return matcher.is_stopped() or matcher.is_error()

    def follow_beams(
        self, moved: Sequence[tuple[TokenSequence, TokenSequence]], live: Iterable[TokenSequence]
    ) -> None:
        """`moved`: (beam, parent) pairs of a beam-search step (BeamSearch.step)."""
        for seq, parent in moved:  # copies first: a parent has not fed its token yet
            if seq is not parent:
                self.fork(parent, seq)
        for seq, _ in moved:
            self.advance(seq)  # a finished grammar then allows only EOS: the beam ends there
        live_ids = {seq.seq_id for seq in live}
        for seq_id in [s for s in self._matchers if s not in live_ids]:
            del self._matchers[seq_id]
