"""The draft-model proposer: a smaller model sharing the target's tokenizer proposes its own
greedy continuation of each sequence, for all the step's decoding sequences in one batch.

Contract: `build_draft(config, vocab_size)` loads `config.speculative.model` as a runner of its
own (engine/runner_factory.py, with the target's device, dtype, block size and CPU kernels; no
decode graphs, no tensor parallel) with its own paged KV cache and block manager (no prefix
caching). `DraftProposer.propose_all(limits)` (after a step, for every sequence awaiting a
decode: `{seq: limit}`) returns each sequence's proposal of up to min(k, limit) tokens, drafted
as one batch: one draft forward per proposed position for all of them, so with B sequences
speculating a step runs k draft forwards of B rows each, not B * k forwards of one row.
`num_forwards` counts the draft forwards; `on_forward(seconds)`, when set, hears each one's
wall time (the Speculator's counters).

Each forward: a sequence's first chunk catches its draft cache up with the committed tokens
(those it has not computed, or those after the first one that differs from what it computed
last time, i.e. its own rejected proposals: 1 token, 2 when every proposal was kept), then one
token per forward; each proposed token is the draft's argmax.

Why greedy: a proposal that does not depend on random draws is a point mass, so the target
verifies it with the same rule as an n-gram proposal (acceptance.accept_matching): greedy
requests keep their tokens, sampled requests their distribution, and seeded requests their
exact tokens. Sampling the draft (and the rejection rule with its q) would raise acceptance on
sampled requests at the cost of that; not done.

Blocks: a sequence's draft state is dropped when its sequence has finished (checked at every
call) or, least recently proposed first, when the draft cache runs out of blocks (never one of
the batch being drafted); a sequence whose state cannot get blocks stops its proposal there.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections import OrderedDict
from collections.abc import Callable
from pathlib import Path

from engine.config import EngineConfig
from engine.requests.request import TokenSequence
from engine.runner import Runner
from engine.runner_factory import build_runner
from engine.scheduling.block_manager import BlockManager, PrefixMatch
from engine.scheduling.step_plan import ScheduledChunk

log = logging.getLogger("tgserve.engine")


class DraftProposer:
    def __init__(
        self, runner: Runner, num_blocks: int, block_size: int, k: int, max_model_len: int
    ) -> None:
        self.runner = runner
        self.num_tokens = k
        self.max_model_len = max_model_len  # the draft's context: it proposes within it
        self.blocks = BlockManager(num_blocks, block_size, enable_prefix_caching=False)
        self.num_forwards = 0  # draft forwards run (a batch of sequences counts once)
        self.on_forward: Callable[[float], None] | None = None
        # target sequence -> its draft mirror, least recently proposed first
        self._mirrors: OrderedDict[TokenSequence, TokenSequence] = OrderedDict()
        self._copied: dict[TokenSequence, int] = {}  # target sequence -> tokens its mirror copied

    def propose_all(self, limits: dict[TokenSequence, int]) -> dict[TokenSequence, tuple[int, ...]]:
        self._forget_finished()
        return self._draft_batch({seq: min(n, self.num_tokens) for seq, n in limits.items()})

    def _draft_batch(self, steps: dict[TokenSequence, int]) -> dict[TokenSequence, tuple[int, ...]]:
        """Drafts up to `steps[seq]` tokens for each sequence, all of them in each forward."""
        drafts = {seq: self._mirror(seq) for seq in steps}
        proposals: dict[TokenSequence, list[int]] = {seq: [] for seq in steps}
        for seq in steps:  # within the draft's context
            steps[seq] = min(steps[seq], self.max_model_len - seq.num_tokens)
        active = [seq for seq in steps if steps[seq] > 0]
        batch = set(drafts.values())
        while active:
            rows = [seq for seq in active if self._reserve(drafts[seq], batch)]
            if not rows:
                break
            chunks = [
                ScheduledChunk(None, d, d.num_computed_tokens, d.num_uncomputed_tokens, True)
                for d in (drafts[seq] for seq in rows)
            ]
            started = time.perf_counter()
            tokens = self.runner.execute(chunks).tokens  # each row's argmax, in chunk order
            self.num_forwards += 1
            if self.on_forward is not None:
                self.on_forward(time.perf_counter() - started)
            for seq, chunk, token in zip(rows, chunks, tokens, strict=True):
                chunk.seq.num_computed_tokens += chunk.num_new_tokens
                chunk.seq.token_ids.append(token)
                proposals[seq].append(token)
            active = [seq for seq in rows if len(proposals[seq]) < steps[seq]]
        return {seq: tuple(proposal) for seq, proposal in proposals.items()}

    def _mirror(self, seq: TokenSequence) -> TokenSequence:
        """The draft's copy of `seq`: its tokens, computed as far as the cache still agrees."""
        draft = self._mirrors.pop(seq, None)
        if draft is None:
            draft = TokenSequence(0, [], seq.num_prompt_tokens)
            self.blocks.admit([draft], [PrefixMatch((), 0, 0)], [0])
            self._copied[seq] = 0
        # the tokens copied from `seq` last time are committed ones, unchanged since: the first
        # difference (from the draft's own proposals) lies after them
        limit = min(draft.num_computed_tokens, seq.num_tokens - 1)  # >= 1 token to compute
        agree = min(self._copied[seq], limit)
        while agree < limit and draft.token_ids[agree] == seq.token_ids[agree]:
            agree += 1
        del draft.token_ids[agree:]
        draft.token_ids.extend(seq.token_ids[agree:])
        self._copied[seq] = seq.num_tokens
        draft.num_computed_tokens = agree
        self.blocks.free(draft, keep=self.blocks.blocks_for(draft.num_tokens))
        self._mirrors[seq] = draft
        return draft

    def _reserve(self, draft: TokenSequence, protected: set[TokenSequence]) -> bool:
        """Blocks for `draft`'s uncomputed tokens, evicting the states of sequences outside
        the batch (`protected`: its drafts), least recently proposed first."""
        new = draft.num_uncomputed_tokens
        while self.blocks.blocks_to_append([(draft, new)]) > self.blocks.num_free_blocks:
            victim = next((s for s, d in self._mirrors.items() if d not in protected), None)
            if victim is None:
                return False
            self._drop(victim)
        self.blocks.append(draft, new)
        return True

    def _drop(self, seq: TokenSequence) -> None:
        self.blocks.free(self._mirrors.pop(seq))
        self._copied.pop(seq, None)

    def _forget_finished(self) -> None:
        for seq in [s for s in self._mirrors if s.is_finished]:
            self._drop(seq)


def build_draft(config: EngineConfig, vocab_size: int) -> DraftProposer:
    """The draft runner for `config.speculative.model` (see the module contract)."""
    spec = config.speculative
    draft_config = dataclasses.replace(
        config,
        speculative=None,
        tensor_parallel_size=1,
        enforce_eager=True,  # its steps are proposals, verified by the target
        cpu_kernels_background=False,
    )
    built = build_runner(Path(spec.model), draft_config, False, sampleable_vocab=vocab_size)
    draft_vocab = built.runner.vocab_size
    if draft_vocab != vocab_size:
        raise ValueError(
            f"speculative_model {spec.model!r} has a vocabulary of {draft_vocab} tokens, the "
            f"served model {vocab_size}: a draft model must share the served model's tokenizer"
        )
    log.info("draft model %s: %d KV blocks", spec.model, built.num_blocks)
    return DraftProposer(
        built.runner, built.num_blocks, config.block_size, spec.num_tokens, built.max_model_len
    )
