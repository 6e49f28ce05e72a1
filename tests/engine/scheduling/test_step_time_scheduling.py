"""Step-time-aware scheduling (issue #12), with a fake cost model and a fake clock
(fake_step_cost.py): chunks follow the target while streams decode and fill the budget when
nobody does; every step with decodes is predicted within the target, floors included, unless
the decodes alone (nearly) fill it, and then only the anchor passes it, by its few tokens;
before the cost model is fitted, decoding steps take a small prefill. Contention (short
requests behind long ones, starvation, priority): test_step_time_fairness.py.
"""

from __future__ import annotations

import random

from engine.scheduling.prefill_budget import (
    ANCHOR_MIN_CHUNK,
    ANCHOR_WINDOW_SHARE,
    COLD_PREFILL_TOKENS,
    MIN_PREFILL_CHUNK,
)
from engine.scheduling.step_cost import StepCostModel
from tests.engine.scheduling.fake_step_cost import FakeCost, chunk_of
from tests.engine.scheduling.scheduler_driver import Driver, prompt, solo


def test_the_prefill_chunk_follows_the_target_while_streams_decode():
    cost = FakeCost(fixed=0.010, per_row=0.001)  # 10 ms + 1 ms per row
    for target_ms, chunk in ((50, 50 - 10 - 4), (100, 100 - 10 - 4)):
        rng = random.Random(target_ms)
        d = Driver(
            num_blocks=256,
            max_num_batched_tokens=512,
            cost_model=cost,
            target_itl_ms=target_ms,
            max_num_seqs=8,
        )
        streams = [d.add(f"s{i}", prompt(rng, 3), 60) for i in range(4)]
        d.step()  # the four short prompts: now they decode
        long = d.add("long", prompt(rng, 400), 2)
        while long.seqs[0].num_output_tokens == 0:
            remaining = 400 - long.seqs[0].num_computed_tokens
            out = d.step()
            assert all(chunk_of(out, s.request_id) == 1 for s in streams)
            assert chunk_of(out, "long") == min(chunk, remaining)
            assert cost.predict(out.num_batched_tokens, out.num_pairs) <= target_ms / 1000 + 1e-9
        d.run()
        for r in [*streams, long]:
            assert list(r.seqs[0].output_token_ids) == solo(r.prompt_token_ids, r.params.max_tokens)


def test_steps_that_deliver_only_to_whole_output_requests_fill_the_budget():
    """Decodes and first tokens of requests nobody streams (stream false, offline batches) do
    not window a step: the long prompt's chunks fill the token budget. One streamed decode
    among them holds the step to the target again."""
    cost = FakeCost(fixed=0.010, per_row=0.001)  # 10 ms + 1 ms per row
    rng = random.Random(7)
    d = Driver(
        num_blocks=512,
        max_num_batched_tokens=256,
        cost_model=cost,
        target_itl_ms=50,
        max_num_seqs=8,
        max_model_len=1024,
    )
    whole = [d.add(f"w{i}", prompt(rng, 3), 40, streamed=False) for i in range(4)]
    d.step()  # the four short prompts: now they decode
    long = d.add("long", prompt(rng, 700), 2, streamed=False)
    out = d.step()
    assert all(chunk_of(out, w.request_id) == 1 for w in whole)
    assert chunk_of(out, "long") == 256 - 4  # the budget, far past the 50 ms target
    stream = d.add("stream", prompt(rng, 2), 30)  # streamed: its first token is a delivery
    d.step()
    out = d.step()  # it decodes now: the window is back
    assert chunk_of(out, "stream") == 1 and 0 < chunk_of(out, "long") < 50
    assert cost.predict(out.num_batched_tokens, out.num_pairs) <= 0.050 + 1e-9
    d.run()
    for r in [*whole, long, stream]:
        assert list(r.seqs[0].output_token_ids) == solo(r.prompt_token_ids, r.params.max_tokens)


def test_attention_pairs_shrink_the_chunk_of_a_long_context():
    cost = FakeCost(fixed=0.010, per_row=0.0005, per_pair=0.000002)
    d = Driver(
        num_blocks=512,
        max_num_batched_tokens=1024,
        cost_model=cost,
        target_itl_ms=100,
        max_num_seqs=4,
        max_model_len=2048,
    )
    d.add("stream", [1, 2, 3], 200)
    d.step()
    long = d.add("long", prompt(random.Random(0), 1500), 1)
    sizes = []
    while long.seqs[0].num_output_tokens == 0:
        out = d.step()
        sizes.append(chunk_of(out, "long"))
        assert cost.predict(out.num_batched_tokens, out.num_pairs) <= 0.1 + 1e-9
    assert sizes[0] > 2 * sizes[-2]  # later chunks attend to more keys: fewer rows
    assert min(sizes[:-1]) < MIN_PREFILL_CHUNK  # the floor itself shrank to fit the target


def test_when_decodes_nearly_fill_the_target_only_the_anchor_passes_it_by_a_few_tokens():
    cost = FakeCost(fixed=0.010, per_row=0.001)  # 10 ms + 1 ms per row
    rng = random.Random(5)
    d = Driver(
        num_blocks=1024,
        max_num_batched_tokens=512,
        cost_model=cost,
        target_itl_ms=50,
        max_num_seqs=48,
        max_model_len=1024,
    )
    streams = [d.add(f"s{i}", prompt(rng, 1), 30) for i in range(38)]
    d.step()  # 38 decodes from now on: 48 ms of the 50
    long = d.add("long", prompt(rng, 200), 2)  # the anchor
    short = d.add("short", prompt(rng, 3), 2)  # shorter, but the window has no room for it
    for _ in range(10):
        out = d.step()
        assert all(chunk_of(out, s.request_id) == 1 for s in streams)
        assert chunk_of(out, "long") == ANCHOR_MIN_CHUNK  # progresses every step
        assert chunk_of(out, "short") == 0
        assert (
            cost.predict(out.num_batched_tokens, out.num_pairs) <= 0.050 + ANCHOR_MIN_CHUNK * 0.001
        )
    d.run()
    for r in [*streams, long, short]:
        assert list(r.seqs[0].output_token_ids) == solo(r.prompt_token_ids, r.params.max_tokens)


def test_the_anchors_floor_takes_a_share_of_a_small_window_and_shortest_first_the_rest():
    cost = FakeCost(fixed=0.010, per_row=0.001)  # 10 ms + 1 ms per row
    rng = random.Random(7)
    d = Driver(
        num_blocks=1024,
        max_num_batched_tokens=512,
        cost_model=cost,
        target_itl_ms=50,
        max_num_seqs=32,
        max_model_len=1024,
    )
    streams = [d.add(f"s{i}", prompt(rng, 1), 30) for i in range(20)]
    d.step()  # 20 decodes: 30 ms, 20 rows of slack
    long = d.add("long", prompt(rng, 300), 2)  # the anchor
    short = d.add("short", prompt(rng, 12), 2)
    out = d.step()
    floor = int(ANCHOR_WINDOW_SHARE * 20)
    assert chunk_of(out, "short") == 12  # whole: the anchor held only its share back
    assert chunk_of(out, "long") == 20 - 12 >= floor  # and it takes what is left
    assert cost.predict(out.num_batched_tokens, out.num_pairs) <= 0.050 + 1e-9
    d.run()
    for r in [*streams, long, short]:
        assert list(r.seqs[0].output_token_ids) == solo(r.prompt_token_ids, r.params.max_tokens)


def test_the_anchors_floor_is_costed_with_its_attention_pairs():
    cost = FakeCost(fixed=0.010, per_row=0.001, per_pair=0.000002)  # 2 us per query x key pair
    rng = random.Random(6)
    d = Driver(
        num_blocks=4096,
        max_num_batched_tokens=4096,
        cost_model=cost,
        target_itl_ms=100,
        max_num_seqs=8,
        max_model_len=8192,
    )
    long = d.add("long", prompt(rng, 8000), 1)
    assert chunk_of(d.step(), "long") == 4096  # alone: the whole token budget (issue 39)
    d.add("stream", prompt(rng, 1), 20)  # admitted beside the long prompt: now it decodes
    d.step()
    out = d.step()
    start = next(c.start for c in out.chunks if c.request is long)
    assert start > 4096
    # each token of the long prompt costs 1 ms + ~8 ms of attention here: 32 would take ~300 ms
    assert 0 < chunk_of(out, "long") < MIN_PREFILL_CHUNK
    assert cost.predict(out.num_batched_tokens, out.num_pairs) <= 0.1 + 1e-9


def test_when_nobody_decodes_prefill_fills_the_token_budget():
    cost = FakeCost(fixed=0.010, per_row=0.001)
    d = Driver(
        num_blocks=512,
        max_num_batched_tokens=256,
        cost_model=cost,
        target_itl_ms=20,
        max_model_len=2048,
    )
    long = d.add("long", prompt(random.Random(1), 1000), 3)
    sizes = []
    while long.seqs[0].num_output_tokens == 0:
        sizes.append(chunk_of(d.step(), "long"))
    assert sizes == [256, 256, 256, 232]


def test_before_the_cost_model_is_fitted_decoding_steps_take_a_small_prefill():
    cost = StepCostModel(min_samples=4)  # the real model, fresh: not ready
    d = Driver(
        num_blocks=2048,
        max_num_batched_tokens=1024,
        cost_model=cost,
        target_itl_ms=100,
        max_model_len=2048,
    )
    rng = random.Random(4)
    first = d.add("first", prompt(rng, 1500), 40)
    assert [chunk_of(d.step(), "first") for _ in range(2)] == [1024, 476]  # nobody decoded
    long = d.add("long", prompt(rng, 1500), 2)
    shorts = [d.add(f"short{i}", prompt(rng, 10), 2) for i in range(3)]
    out = d.step()  # first decodes: the prefill stops at COLD_PREFILL_TOKENS
    assert [chunk_of(out, r.request_id) for r in shorts] == [10, 10, 10]
    assert chunk_of(out, "long") == COLD_PREFILL_TOKENS - 30
    assert chunk_of(d.step(), "long") == COLD_PREFILL_TOKENS
    for rows in (1, 33, 256, 129):  # timed steps: 1 ms + 0.1 ms per row, now it is fitted
        cost.observe(rows, 0, 0.001 + 0.0001 * rows)
    assert cost.ready
    done = long.seqs[0].num_computed_tokens
    decodes = [r for r in (first, *shorts) if not r.is_finished]
    pairs = sum(r.seqs[0].num_tokens for r in decodes)  # one query over each whole context
    out = d.step()
    want = cost.max_chunk(len(decodes), pairs, done, 1500 - done, 0.1)
    assert chunk_of(out, "long") == min(want, 1024 - len(decodes)) > COLD_PREFILL_TOKENS
    d.run()
    for r in (first, long, *shorts):
        assert list(r.seqs[0].output_token_ids) == solo(r.prompt_token_ids, r.params.max_tokens)


def test_after_one_timed_step_a_fresh_model_sizes_decoding_steps_with_its_prior():
    cost = StepCostModel()  # the real model: not ready before 8 steps
    cost.observe(200, 20_000, 0.200)  # one timed step: 1 ms per row, fixed part included
    assert not cost.ready and cost.rough_per_row == 0.001
    d = Driver(
        num_blocks=1024,
        max_num_batched_tokens=1024,
        cost_model=cost,
        target_itl_ms=100,
        max_num_seqs=32,
        max_model_len=2048,
    )
    rng = random.Random(8)
    streams = [d.add(f"s{i}", prompt(rng, 1), 20) for i in range(10)]
    d.step()  # nobody decoded: prompts only
    long = d.add("long", prompt(rng, 1000), 2)
    out = d.step()
    assert chunk_of(out, "long") == 100 - 10  # rows x 1 ms within 100 ms (cold: 256)
    d.run()
    for r in [*streams, long]:
        assert list(r.seqs[0].output_token_ids) == solo(r.prompt_token_ids, r.params.max_tokens)
