"""The draft-model proposer: a smaller model sharing the target's tokenizer proposes its own
greedy continuation of each sequence.

Contract: `build_draft(config, vocab_size)` loads `config.speculative.model` as a runner of its
own (engine/runner_factory.py, with the target's device, dtype, block size and CPU kernels; no
decode graphs, no tensor parallel) with its own paged KV cache and block manager (no prefix
caching). `DraftProposer.propose(seq, limit)` returns up to min(k, limit) tokens: the draft
first catches its cache up with the sequence's committed tokens (one chunk: the tokens it has
not computed, or those after the first one that differs from what it computed last time, i.e.
its own rejected proposals), then decodes greedily one token per forward.

Why greedy: a proposal that does not depend on random draws is a point mass, so the target
verifies it with the same rule as an n-gram proposal (acceptance.accept_matching): greedy
requests keep their tokens, sampled requests their distribution, and seeded requests their
exact tokens. Sampling the draft (and the rejection rule with its q) would raise acceptance on
sampled requests at the cost of that; not done.

Blocks: a sequence's draft state is dropped when its sequence has finished (checked at every
call) or, least recently proposed first, when the draft cache runs out of blocks; a sequence
whose state cannot get blocks gets no proposal.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import OrderedDict
from pathlib import Path

from engine.config import EngineConfig
from engine.model_runner import ModelRunner
from engine.requests.request import TokenSequence
from engine.runner_factory import build_runner
from engine.scheduling.block_manager import BlockManager, PrefixMatch
from engine.scheduling.step_plan import ScheduledChunk

log = logging.getLogger("tgserve.engine")


class DraftProposer:
    def __init__(
        self, runner: ModelRunner, num_blocks: int, block_size: int, k: int, max_model_len: int
    ) -> None:
        self.runner = runner
        self.num_tokens = k
        self.max_model_len = max_model_len  # the draft's context: it proposes within it
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        # target sequence -> its draft mirror, least recently proposed first
        self._mirrors: OrderedDict[TokenSequence, TokenSequence] = OrderedDict()

    def propose(self, seq: TokenSequence, limit: int) -> tuple[int, ...]:
        self._forget_finished()
        draft = self._mirror(seq)
        proposal: list[int] = []
        room = self.max_model_len - seq.num_tokens  # positions the draft can still compute
        for _ in range(min(self.num_tokens, limit, room)):
            new = draft.num_uncomputed_tokens
            if not self._reserve(draft, new):
                break
            chunk = ScheduledChunk(None, draft, draft.num_computed_tokens, new, True)
            logits = self.runner.execute([chunk]).sampling  # [1, V]
            draft.num_computed_tokens += new
            token = int(logits[0].argmax())
            draft.token_ids.append(token)
            proposal.append(token)
        return tuple(proposal)

    def _mirror(self, seq: TokenSequence) -> TokenSequence:
        """The draft's copy of `seq`: its tokens, computed as far as the cache still agrees."""
        draft = self._mirrors.pop(seq, None)
        if draft is None:
            draft = TokenSequence(0, [], seq.num_prompt_tokens)
            self.blocks.admit([draft], [PrefixMatch((), 0, 0)], [0])
        agree = 0
        limit = min(draft.num_computed_tokens, seq.num_tokens - 1)  # >= 1 token to compute
        while agree < limit and draft.token_ids[agree] == seq.token_ids[agree]:
            agree += 1
        draft.token_ids = list(seq.token_ids)
        draft.num_computed_tokens = agree
        self.blocks.free(draft, keep=self.blocks.blocks_for(draft.num_tokens))
        self._mirrors[seq] = draft
        return draft

    def _reserve(self, draft: TokenSequence, new: int) -> bool:
        """Blocks for `new` more tokens of `draft`, evicting other sequences' states."""
        while self.blocks.blocks_to_append([(draft, new)]) > self.blocks.num_free_blocks:
            victim = next((s for s in self._mirrors if self._mirrors[s] is not draft), None)
            if victim is None:
                return False
            self.blocks.free(self._mirrors.pop(victim))
        self.blocks.append(draft, new)
        return True

    def _forget_finished(self) -> None:
        for seq in [s for s in self._mirrors if s.is_finished]:
            self.blocks.free(self._mirrors.pop(seq))


def build_draft(config: EngineConfig, vocab_size: int) -> DraftProposer:
    """The draft runner for `config.speculative.model` (see the module contract)."""
    spec = config.speculative
    draft_config = dataclasses.replace(
        config,
        speculative=None,
        tensor_parallel_size=1,
        enforce_eager=True,  # its steps are single sequences, verified by the target
        cpu_kernels_background=False,
    )
    built = build_runner(Path(spec.model), draft_config, False, sampleable_vocab=vocab_size)
    draft_vocab = built.runner.sampleable_vocab or built.model_config.vocab_size
    if draft_vocab != vocab_size:
        raise ValueError(
            f"speculative_model {spec.model!r} has a vocabulary of {draft_vocab} tokens, the "
            f"served model {vocab_size}: a draft model must share the served model's tokenizer"
        )
    log.info("draft model %s: %d KV blocks", spec.model, built.num_blocks)
    return DraftProposer(
        built.runner, built.num_blocks, config.block_size, spec.num_tokens, built.max_model_len
    )
