"""Speculative decoding's bookkeeping on the scheduler tests' fake model (scheduler_driver.py):
proposals are written into the KV slots their chunk's table names, verified against the fake
model's own choice at every scored position, and committed through accept_proposed /
settle_proposed. Oracle: `solo`, the model iterated without a scheduler. Any slot left holding
a rejected token where a committed one should be, a prefix-cache block registered with a
rejected token, or a block leaked, changes an output or fails the driver's checks."""

from __future__ import annotations

import random

from hypothesis import given, settings
from hypothesis import strategies as st

from engine.requests.request import RequestStatus
from engine.scheduling.step_plan import Proposals
from engine.speculative.acceptance import accept_matching
from tests.engine.scheduling.scheduler_driver import VOCAB, Driver, next_token, prompt, solo


class SpeculatingDriver(Driver):
    """Driver whose decodes carry proposals: the true continuation up to a random point, then
    wrong tokens (so some positions are kept and some rejected)."""

    def __init__(self, k: int, seed: int, **kwargs) -> None:
        super().__init__(**kwargs)
        self.k = k
        self.rng = random.Random(seed)
        self.proposed = self.accepted = 0

    def propose(self, request, seq) -> tuple[int, ...]:
        limit = min(self.k, request.params.max_tokens - seq.num_output_tokens - 1)
        truth = solo(seq.token_ids, max(limit, 0))
        right = self.rng.randint(0, len(truth))
        return tuple(truth[:right]) + tuple(
            (t + 1 + self.rng.randrange(VOCAB - 1)) % VOCAB for t in truth[right:]
        )

    def step(self):
        out = self.sched.schedule()
        self.outputs.append(out)
        assert out.num_batched_tokens <= self.config.max_num_batched_tokens
        for src, dst in out.block_copies:
            self.slots[dst] = list(self.slots[src])
        for c in out.chunks:  # the chunk's rows: known tokens, then the proposal
            for p, token in zip(range(c.start, c.seq_len), c.input_ids, strict=True):
                self.slots[c.seq.block_table[p // self.bs]][p % self.bs] = (token, p)
        scored = {
            id(c): [
                next_token(self.read(c.seq, p + 1))
                for p in range(c.seq_len - 1 - len(c.proposal), c.seq_len)
            ]
            for c in out.chunks
            if c.sample
        }
        self.sched.on_step_done(out)
        for c in (c for c in out.chunks if c.sample):
            request, seq = c.request, c.seq
            verdict = accept_matching(c.proposal, scored[id(c)])
            self.proposed += len(c.proposal)
            self.accepted += verdict.num_accepted
            for j, token in enumerate(verdict.tokens):
                if j:
                    self.sched.accept_proposed(seq)
                seq.append_token(token)
                if seq.num_output_tokens >= request.params.max_tokens:
                    self.sched.finish_seq(request, seq, "length")
                    break
            self.sched.settle_proposed(seq)
            if not seq.is_finished:  # blocks past its tokens (rejected ones') were freed
                assert len(seq.block_table) <= self.bm.blocks_for(seq.num_tokens)
        self.bm.check_invariants()
        # after the step, as the engine does: proposals handed to the scheduler as data
        awaiting = [
            (request, seq)
            for request in self.requests.values()
            if request.status is RequestStatus.RUNNING
            for seq in request.live_seqs
            if seq.num_uncomputed_tokens == 1
        ]
        self.sched.take_proposals(Proposals.of({s: self.propose(r, s) for r, s in awaiting}))
        return out


@settings(max_examples=40, deadline=None)
@given(
    seed=st.integers(0, 2**16),
    k=st.integers(1, 6),
    num_blocks=st.integers(24, 80),
    budget=st.sampled_from([6, 16, 64]),
)
def test_speculating_requests_return_their_solo_outputs(seed, k, num_blocks, budget):
    rng = random.Random(seed)
    shared = prompt(rng, rng.randrange(0, 12))  # prefix-cache hits between requests
    d = SpeculatingDriver(
        k, seed, num_blocks=num_blocks, max_num_seqs=4, max_num_batched_tokens=budget
    )
    reqs = [
        d.add(f"r{i}", shared + prompt(rng, rng.randrange(1, 12)), rng.randrange(1, 20))
        for i in range(6)
    ]
    d.run()
    for r in reqs:
        assert list(r.seqs[0].output_token_ids) == solo(r.prompt_token_ids, r.params.max_tokens)
    d.assert_no_leaks()


def test_proposals_are_kept_and_rejected_and_preemption_happens():
    rng = random.Random(3)
    d = SpeculatingDriver(4, 3, num_blocks=20, max_num_seqs=4, max_num_batched_tokens=32)
    reqs = [d.add(f"r{i}", prompt(rng, 8), 24) for i in range(4)]
    d.run()
    for r in reqs:
        assert list(r.seqs[0].output_token_ids) == solo(r.prompt_token_ids, 24)
    assert 0 < d.accepted < d.proposed
    assert d.sched.stats().num_preemptions > 0
    d.assert_no_leaks()
