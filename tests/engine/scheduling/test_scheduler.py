"""Scheduler: token budget, decode-first chunked prefill, preemption, aborts, admission errors,
prefix caching and leaks, driven by a fake model through the engine's update protocol.

The fake model writes (token, position) into the slot each token's block table names and
"samples" `next_token(context)` from the context it reads back through the table, so any
bookkeeping error (wrong table, missing copy, stale cache hit, overwritten block) changes the
output. The oracle is `solo`: the same function iterated on a plain token list, no scheduler.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.config import EngineConfig
from engine.requests.request import Request
from engine.sampling.sampling_params import SamplingParams
from engine.scheduling.admission_check import check_admissible
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import QueueFullError, Scheduler, SchedulerOutput

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

    def __init__(self, num_blocks: int, block_size: int = 4, max_model_len: int = 512, **cfg):
        self.config = EngineConfig(block_size=block_size, **cfg)
        self.bm = BlockManager(num_blocks, block_size, self.config.enable_prefix_caching)
        self.sched = Scheduler(self.config, self.bm, max_model_len)
        self.bs = block_size
        self.slots: list[list[tuple[int, int] | None]] = [
            [None] * block_size for _ in range(num_blocks)
        ]
        self.outputs: list[SchedulerOutput] = []
        self.stop_early: dict[str, int] = {}  # request id -> output length at which it "stops"
        self.fork_n: dict[str, int] = {}  # request id -> sequences to fork after the prompt
        self.queue: list[str] = []  # a model of the waiting queue: FIFO, preempted to the front
        self.requests: dict[str, Request] = {}

    def add(self, rid: str, prompt: list[int], max_tokens: int, n: int = 1) -> Request:
        request = Request(rid, prompt, SamplingParams(max_tokens=max_tokens, n=n))
        sched = self.sched  # as Engine.new_request does
        check_admissible(len(prompt), request.params, rid, sched.max_model_len, sched.config.max_num_seqs, sched.block_manager)
        self.sched.add_request(request)
        self.queue.append(rid)
        self.requests[rid] = request
        if n > 1:
            self.fork_n[rid] = n
        return request

    def step(self) -> SchedulerOutput:
        running = {rid for rid, r in self.requests.items() if r.status.value == "running"}
        out = self.sched.schedule()
        self.outputs.append(out)
        assert out.num_batched_tokens <= self.config.max_num_batched_tokens
        assert len(out.chunks) <= self.config.max_num_seqs
        self.check_queue_order(out, running)
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

    def check_queue_order(self, out: SchedulerOutput, running_before: set[str]) -> None:
        self.queue = [rid for rid in self.queue if rid not in out.aborted]
        admitted = list(dict.fromkeys(c.request.request_id for c in out.chunks))
        admitted = [rid for rid in admitted if rid not in running_before]
        if out.preempted:
            assert not admitted, "admitted a waiting request in a step that preempted"
            assert not set(out.preempted) & {c.request.request_id for c in out.chunks}
        assert admitted == self.queue[: len(admitted)], "admission is not FIFO"
        self.queue = list(reversed(out.preempted)) + self.queue[len(admitted) :]
        for rid in out.preempted:
            for seq in self.requests[rid].seqs:
                assert seq.num_computed_tokens == 0 and seq.block_table == []

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


def test_batched_requests_match_their_solo_outputs_and_respect_the_budget():
    rng = random.Random(0)
    d = Driver(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=16)
    reqs = [
        d.add(f"r{i}", prompt(rng, rng.randrange(1, 40)), rng.randrange(1, 12)) for i in range(10)
    ]
    d.run()
    for out in d.outputs:
        assert out.num_batched_tokens == sum(c.num_new_tokens for c in out.chunks) <= 16
        assert len({id(c.seq) for c in out.chunks}) == len(out.chunks) <= 4
    for r in reqs:
        assert list(r.seqs[0].output_token_ids) == solo(r.prompt_token_ids, r.params.max_tokens)
        assert r.seqs[0].finish_reason == "length"
    d.assert_no_leaks()


def test_a_long_prompt_is_chunked_while_every_decode_keeps_its_token_each_step():
    rng = random.Random(1)
    d = Driver(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=8)
    streams = [d.add(f"s{i}", prompt(rng, 3), 30) for i in range(3)]
    d.step()  # the three short prompts (9 tokens) need two steps: one of them is chunked
    d.step()
    long = d.add("long", prompt(rng, 40), 2)
    prefill_steps = 0
    while long.seqs[0].num_output_tokens == 0:
        decoding = [
            r for r in streams if not r.is_finished and r.seqs[0].num_uncomputed_tokens == 1
        ]
        out = d.step()
        got = {c.request.request_id: c for c in out.chunks}
        assert all(got[r.request_id].num_new_tokens == 1 for r in decoding)  # decodes first
        assert [c.request.request_id for c in out.chunks][: len(decoding)] == [
            r.request_id for r in decoding
        ]
        if "long" in got:
            prefill_steps += 1
            assert got["long"].num_new_tokens == 8 - len(decoding)  # the rest of the budget
    assert prefill_steps == 8  # 40 tokens at 5 per step
    d.run()
    for r in [*streams, long]:
        assert list(r.seqs[0].output_token_ids) == solo(r.prompt_token_ids, r.params.max_tokens)


def test_preemption_by_recompute_loses_nothing():
    rng = random.Random(2)
    # 12 blocks of 4 tokens hold ~3 sequences of 16 tokens; 12 requests must share them.
    d = Driver(
        num_blocks=12, max_num_seqs=8, max_num_batched_tokens=32, enable_prefix_caching=False
    )
    reqs = [
        d.add(f"r{i}", prompt(rng, rng.randrange(4, 12)), rng.randrange(4, 12)) for i in range(12)
    ]
    d.run()
    assert d.sched.stats().num_preemptions >= 1
    assert sum(r.num_preemptions for r in reqs) == d.sched.stats().num_preemptions
    assert any(out.preempted for out in d.outputs)
    for r in reqs:
        assert list(r.seqs[0].output_token_ids) == solo(r.prompt_token_ids, r.params.max_tokens)
    d.assert_no_leaks()


def test_the_most_recently_admitted_request_is_preempted_first():
    d = Driver(num_blocks=4, max_num_seqs=4, max_num_batched_tokens=8, enable_prefix_caching=False)
    a = d.add("a", [1, 2, 3], 8)  # 3 + 8 - 1 = 10 tokens of K/V at most: 3 blocks
    b = d.add("b", [4, 5, 6], 8)
    for _ in range(20):
        if d.step().preempted:
            break
    assert d.outputs[-1].preempted == ("b",) and a.status.value == "running"
    d.run()
    assert list(b.seqs[0].output_token_ids) == solo([4, 5, 6], 8)


def test_aborts_of_running_and_waiting_requests_take_effect_at_the_next_step():
    rng = random.Random(3)
    d = Driver(num_blocks=32, max_num_seqs=2, max_num_batched_tokens=8)
    run_a, run_b, wait = (d.add(x, prompt(rng, 5), 20) for x in ("a", "b", "w"))
    d.step()
    d.step()
    assert run_a.status.value == "running" and wait.status.value == "waiting"
    d.sched.abort(run_a)
    d.sched.abort(wait)
    d.sched.abort(Request("no-such-request", [1], SamplingParams()))  # never added: ignored
    assert run_a.status.value == "running"  # not before the next schedule()
    out = d.step()
    assert set(out.aborted) == {"a", "w"}
    assert all(c.request is run_b for c in out.chunks)
    assert run_a.seqs[0].finish_reason == "abort" and run_a.seqs[0].block_table == []
    d.run()
    assert list(run_b.seqs[0].output_token_ids) == solo(run_b.prompt_token_ids, 20)
    d.assert_no_leaks()


def test_requests_that_can_never_run_are_rejected_at_admission():
    d = Driver(
        num_blocks=8,
        max_model_len=64,
        max_num_seqs=4,
        max_num_batched_tokens=16,
        max_queued_requests=2,
    )
    with pytest.raises(ValueError, match="maximum context length 64"):
        d.add("too-long", [1] * 60, 5)
    with pytest.raises(ValueError, match="KV blocks but the cache has 8"):
        d.add("too-big", [1] * 30, 10)  # 39 K/V tokens = 10 blocks of 4
    with pytest.raises(ValueError, match="max_num_seqs"):
        d.add("too-wide", [1], 2, n=8)
    d.add("ok", [1] * 30, 3)  # 32 K/V tokens = 8 blocks: exactly the cache
    d.add("ok2", [1], 1)
    with pytest.raises(QueueFullError, match="queue is full"):
        d.add("one-too-many", [1], 1)
    with pytest.raises(ValueError, match="at least one token"):
        Request("empty", [], SamplingParams())
    d.run()
    d.assert_no_leaks()


def test_a_shared_prefix_is_computed_once_and_outputs_match_a_cold_run():
    rng = random.Random(4)
    shared, tail = prompt(rng, 48), prompt(rng, 5)
    d = Driver(num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64)
    first = d.add("first", shared + prompt(rng, 3), 6)
    d.run()
    computed_before = sum(o.num_batched_tokens for o in d.outputs)
    second = d.add("second", shared + tail, 6)
    d.run()
    computed = sum(o.num_batched_tokens for o in d.outputs) - computed_before
    assert computed == (53 - 48) + 6 - 1  # only the tail, then decodes
    assert second.num_cached_prompt_tokens == 48
    blocks = d.sched.stats().blocks
    assert (blocks.prefix_cache_queries, blocks.prefix_cache_hits) == (51 + 53, 48)
    cold = Driver(
        num_blocks=64, max_num_seqs=4, max_num_batched_tokens=64, enable_prefix_caching=False
    )
    cold_second = cold.add("second", shared + tail, 6)
    cold.run()
    assert second.seqs[0].output_token_ids == cold_second.seqs[0].output_token_ids
    assert list(second.seqs[0].output_token_ids) == solo(shared + tail, 6)
    assert list(first.seqs[0].output_token_ids) == solo(first.prompt_token_ids, 6)
    d.assert_no_leaks()


def test_forked_sequences_share_the_prompt_and_survive_preemption():
    rng = random.Random(5)
    d = Driver(num_blocks=20, max_num_seqs=8, max_num_batched_tokens=16)
    groups = [d.add(f"g{i}", prompt(rng, 9), 10, n=3) for i in range(3)]
    d.run()
    assert d.sched.stats().num_preemptions >= 1
    for g in groups:
        assert len(g.seqs) == 3 and len({s.output_token_ids for s in g.seqs}) == 3
        for i, seq in enumerate(g.seqs):
            assert list(seq.output_token_ids) == expected(g, i)
    d.assert_no_leaks()


def test_forked_sequences_use_fewer_blocks_than_independent_ones():
    d = Driver(num_blocks=64, max_num_seqs=8, max_num_batched_tokens=64)
    g = d.add("g", list(range(42)), 4, n=4)  # 11 prompt blocks (the last one partial)
    while len(g.live_seqs) < 4:
        d.step()
    assert d.bm.num_used_blocks == 11  # forks share every block
    out = d.step()  # each writes into the shared partial block: 3 copies, the 4th writes in place
    assert len(out.block_copies) == 3
    assert d.bm.num_used_blocks == 10 + 4  # not 4 * 11
    d.run()
    d.assert_no_leaks()


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), prefix_caching=st.booleans())
def test_no_leaks_after_random_finishes_aborts_and_preemptions(seed, prefix_caching):
    rng = random.Random(seed)
    d = Driver(
        num_blocks=rng.randrange(14, 17),  # a 2-sequence request may need 2 * 7 blocks
        max_num_seqs=rng.randrange(3, 9),
        max_num_batched_tokens=rng.choice([8, 12, 16]),
        enable_prefix_caching=prefix_caching,
    )
    base = prompt(rng, 12)
    arrivals = sorted((rng.randrange(8), i) for i in range(rng.randrange(4, 14)))
    aborted: set[str] = set()
    reqs: list[Request] = []
    for t in range(400):
        while arrivals and arrivals[0][0] <= t:
            i = arrivals.pop(0)[1]
            p = base[: rng.randrange(0, 12)] + prompt(rng, rng.randrange(1, 6))
            reqs.append(d.add(f"r{i}", p, rng.randrange(4, 13), n=rng.choice([1, 1, 1, 2])))
            if rng.random() < 0.2:
                d.stop_early[f"r{i}"] = rng.randrange(1, 5)
        if reqs and rng.random() < 0.05:
            victim = rng.choice(reqs)
            d.sched.abort(victim)
            aborted.add(victim.request_id)
        if not arrivals and not d.sched.has_work():
            break
        d.step()
    d.assert_no_leaks()
    for r in reqs:
        assert r.is_finished
        if r.request_id in aborted:
            continue
        for i, seq in enumerate(r.seqs):
            out = list(seq.output_token_ids)
            assert out == expected(r, i)[: len(out)] and seq.finish_reason in ("length", "stop")
            assert seq.finish_reason == "stop" or len(out) == r.params.max_tokens


def test_append_token_before_on_step_done_is_refused():
    d = Driver(num_blocks=8, max_num_seqs=2, max_num_batched_tokens=8)
    r = d.add("r", [1, 2, 3], 4)
    d.sched.schedule()
    with pytest.raises(RuntimeError, match="on_step_done"):
        r.seqs[0].append_token(5)
