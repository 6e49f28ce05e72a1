"""A miniature engine for scheduler tests: the scheduler's update protocol around a fake model.

The fake model writes (token, position) into the slot each token's block table names and
"samples" `next_token(context)` from the context it reads back through the table, so any
bookkeeping error (wrong table, missing copy, stale cache hit, overwritten block) changes the
output. The oracle is `solo`: the same function iterated on a plain token list, no scheduler.
"""

from __future__ import annotations

import random

from engine.config import EngineConfig
from engine.requests.request import Request
from engine.requests.sampling_params import SamplingParams
from engine.scheduling.admission_check import check_admissible
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler, SchedulerOutput

VOCAB = 50


def next_token(context: list[int]) -> int:
    return hash(tuple(context)) % VOCAB


def solo(prompt: list[int] | tuple[int, ...], max_tokens: int) -> list[int]:
    tokens = list(prompt)
    for _ in range(max_tokens):
        tokens.append(next_token(tokens))
    return tokens[len(prompt) :]


class Driver:
    """Engine.step() in miniature: schedule -> fake forward -> on_step_done -> append/finish."""

    def __init__(
        self,
        num_blocks: int,
        block_size: int = 4,
        max_model_len: int = 512,
        cost_model=None,
        tiers=None,
        **cfg,
    ):
        self.config = EngineConfig(block_size=block_size, **cfg)
        prefix = self.config.enable_prefix_caching
        if tiers is not None:  # a fake K/V tier store (test_tier_bridge.py) over these slots
            self.bm = BlockManager(num_blocks, block_size, prefix, tiers.hash_fn, tiers)
        else:
            self.bm = BlockManager(num_blocks, block_size, prefix)
        self.tiers = tiers
        self.sched = Scheduler(self.config, self.bm, max_model_len, cost_model)
        self.bs = block_size
        self.slots: list[list[tuple[int, int] | None]] = [
            [None] * block_size for _ in range(num_blocks)
        ]
        self.outputs: list[SchedulerOutput] = []
        self.stop_early: dict[str, int] = {}  # request id -> output length at which it "stops"
        self.fork_n: dict[str, int] = {}  # request id -> sequences to fork after the prompt
        self.requests: dict[str, Request] = {}

    def add(
        self,
        rid: str,
        prompt: list[int],
        max_tokens: int,
        n: int = 1,
        priority: int = 0,
        streamed: bool = True,
    ) -> Request:
        params = SamplingParams(max_tokens=max_tokens, n=n, priority=priority, streamed=streamed)
        request = Request(rid, prompt, params)
        sched = self.sched  # as Engine.new_request does
        check_admissible(
            len(prompt),
            request.params,
            rid,
            sched.max_model_len,
            sched.config.max_num_seqs,
            sched.block_manager,
        )
        self.sched.add_request(request)
        self.requests[rid] = request
        if n > 1:
            self.fork_n[rid] = n
        return request

    def step(self) -> SchedulerOutput:
        waiting = self.waiting_keys()
        out = self.sched.schedule()
        if self.tiers is not None:  # as the engine does before the forward
            self.tiers.transfer(self.slots, self.bm.tiers.take_moves())
        self.outputs.append(out)
        assert out.num_batched_tokens <= self.config.max_num_batched_tokens
        assert len(out.chunks) <= self.config.max_num_seqs
        self.check_queue_order(out, waiting)
        for src, dst in out.block_copies:
            self.slots[dst] = list(self.slots[src])
        for c in out.chunks:  # all writes first, as one forward writes K/V before attending
            for p in range(c.start, c.seq_len):
                self.slots[c.seq.block_table[p // self.bs]][p % self.bs] = (c.seq.token_ids[p], p)
        sampled = [(c, next_token(self.read(c.seq, c.seq_len))) for c in out.chunks if c.sample]
        self.sched.on_step_done(out)
        for c, token in sampled:
            request, seq = c.request, c.seq
            if request.is_finished or seq.is_finished:
                continue
            group = [seq]
            if self.fork_n.get(request.request_id, 1) > len(request.seqs):
                for i in range(1, self.fork_n[request.request_id]):
                    group.append(self.sched.fork_seq(request, seq))
                    group[-1].append_token((token + i) % VOCAB)  # n distinct first tokens
            seq.append_token(token)
            limit = self.stop_early.get(request.request_id, request.params.max_tokens)
            for s in group:
                if s.num_output_tokens >= request.params.max_tokens:
                    self.sched.finish_seq(request, s, "length")
                elif s.num_output_tokens >= limit:
                    self.sched.finish_seq(request, s, "stop")
        self.bm.check_invariants()
        return out

    def check_queue_order(self, out: SchedulerOutput, waiting_before: list[tuple]) -> None:
        """The admission order of the scheduler's docstring: apart from the oldest waiting
        request of the best priority (it may be the anchor), the requests admitted in a step
        are a prefix of the waiting ones sorted by (priority, tokens to compute, arrival)."""
        waiting_before = [w for w in waiting_before if w[-1] not in out.aborted]
        admitted = {c.request.request_id for c in out.chunks} & {w[-1] for w in waiting_before}
        if out.preempted:
            assert not admitted, "admitted a waiting request in a step that preempted"
            assert not set(out.preempted) & {c.request.request_id for c in out.chunks}
        if waiting_before:
            best = min(w[0] for w in waiting_before)
            oldest = min((w for w in waiting_before if w[0] == best), key=lambda w: w[2])[-1]
            order = [w[-1] for w in sorted(waiting_before) if w[-1] != oldest]
            rest = admitted - {oldest}
            assert set(order[: len(rest)]) == rest, "admission does not follow the prefill order"
        for rid in out.preempted:
            for seq in self.requests[rid].seqs:
                assert seq.num_computed_tokens == 0 and seq.block_table == []

    def waiting_keys(self) -> list[tuple]:
        """(priority, tokens to compute, arrival, id) of each waiting request."""
        return [
            (r.params.priority, max(s.num_uncomputed_tokens for s in r.live_seqs), i, rid)
            for i, (rid, r) in enumerate(self.requests.items())
            if r.status.value == "waiting"
        ]

    def read(self, seq, length: int) -> list[int]:
        out = []
        for p in range(length):
            slot = self.slots[seq.block_table[p // self.bs]][p % self.bs]
            assert slot is not None and slot[1] == p, f"position {p} holds {slot}"
            out.append(slot[0])
        return out

    def run(self, max_steps: int = 10_000) -> None:
        for _ in range(max_steps):
            if not self.sched.has_work():
                return
            self.step()
        raise AssertionError("the scheduler made no progress")

    def assert_no_leaks(self) -> None:
        stats = self.sched.stats()
        assert (stats.num_running, stats.num_waiting) == (0, 0)
        assert stats.blocks.num_free == self.bm.num_blocks and stats.blocks.num_used == 0
        self.bm.check_invariants()


def expected(request: Request, seq_index: int) -> list[int]:
    """Solo output of sequence `seq_index`; forked ones start from first token + index."""
    p, max_tokens = list(request.prompt_token_ids), request.params.max_tokens
    if request.params.n == 1:
        return solo(p, max_tokens)
    head = (next_token(p) + seq_index) % VOCAB
    return [head, *solo([*p, head], max_tokens - 1)]


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(VOCAB) for _ in range(n)]
