"""Scheduler: token budget, decode-first chunked prefill, preemption, aborts, admission errors,
prefix caching and leaks, driven by a fake model through the engine's update protocol
(scheduler_driver.py: the fake model, and `solo`, the oracle without a scheduler).
"""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.errors import QueueFullError
from engine.requests.request import Request
from engine.requests.sampling_params import SamplingParams
from tests.engine.scheduling.scheduler_driver import Driver, expected, prompt, solo


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
        max_queued_requests=1,
    )
    with pytest.raises(ValueError, match="maximum context length 64"):
        d.add("too-long", [1] * 60, 5)
    with pytest.raises(ValueError, match="KV blocks but the cache has 8"):
        d.add("too-big", [1] * 30, 10)  # 39 K/V tokens = 10 blocks of 4
    with pytest.raises(ValueError, match="max_num_seqs"):
        d.add("too-wide", [1], 2, n=8)
    d.add("ok", [1] * 30, 3)  # 32 K/V tokens = 8 blocks: exactly the cache
    for i in range(4):  # in flight: max_num_seqs 4 + max_queued_requests 1 = 5, none running
        d.add(f"ok{i}", [1], 1)
    with pytest.raises(QueueFullError, match="5 requests in flight"):
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
