"""n > 1 and best_of: seeded samples are distinct, reproducible and independent of the batch;
they share the prompt's KV blocks; best_of keeps the n of highest log-prob (transformers scores
the continuations as the oracle); preemption and aborts lose nothing."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from engine.requests.sampling_params import SamplingParams
from tests.checkpoints import make_hf_model
from tests.engine.engine_fixtures import (
    assert_no_leaks,
    random_prompts,
    run_beside_a_long_request,
    run_staggered,
    tiny_engine,
)


def sampled(**kw) -> SamplingParams:
    return SamplingParams(**{"temperature": 1.0, "max_tokens": 12, "ignore_eos": True, **kw})


def token_ids(out) -> list[tuple[int, ...]]:
    return [o.token_ids for o in out.outputs]


def test_seeded_n4_is_distinct_reproducible_and_independent_of_traffic(tmp_path) -> None:
    prompt = random_prompts(1, (9, 9), seed=21)[0]
    params = sampled(n=4, seed=1234)
    engine = tiny_engine(tmp_path, max_num_batched_tokens=48)
    alone = engine.generate([prompt], params)[0]
    assert [o.index for o in alone.outputs] == [0, 1, 2, 3]
    assert len(set(token_ids(alone))) == 4
    assert token_ids(tiny_engine(tmp_path).generate([prompt], params)[0]) == token_ids(alone)
    # The same request in the middle of other traffic (seeded and unseeded, staggered arrivals).
    others = random_prompts(5, (3, 40), seed=22)
    mix = [sampled(seed=i if i % 2 else None, max_tokens=5 + i) for i in range(5)]
    batched = run_staggered(
        engine, [*others[:2], prompt, *others[2:]], [*mix[:2], params, *mix[2:]]
    )
    assert token_ids(batched[2]) == token_ids(alone)
    # Child 0 draws from the request's seed itself: it is the n = 1 sample.
    one = engine.generate([prompt], sampled(seed=1234))[0]
    assert one.outputs[0].token_ids == alone.outputs[0].token_ids
    assert_no_leaks(engine)


def test_samples_share_the_prompt_blocks(tmp_path) -> None:
    engine = tiny_engine(tmp_path, block_size=4, max_num_batched_tokens=256)
    prompt = random_prompts(1, (160, 160), seed=23)[0]
    bm = engine.scheduler.block_manager
    single = bm.blocks_for(len(prompt) + 16 - 1)
    engine.add_request("n4", prompt, sampled(n=4, seed=3, max_tokens=16))
    peak, widest = 0, 0
    while engine.has_unfinished_requests():
        engine.step()
        peak = max(peak, engine.stats().kv_blocks_used)
        widest = max(widest, len(getattr(engine.get_request("n4"), "live_seqs", ())))
        bm.check_invariants()
    assert widest == 4
    assert peak <= single + 4 * (16 // 4 + 2)  # the prompt once, each sample its own tail
    assert peak < 1.5 * single  # well under the 4x of four independent sequences
    assert_no_leaks(engine)


def test_best_of_keeps_the_n_highest_logprob_samples(tmp_path) -> None:
    engine = tiny_engine(tmp_path)
    hf = make_hf_model("llama")
    prompt = random_prompts(1, (7, 7), seed=24)[0]
    pool = engine.generate([prompt], sampled(n=5, seed=99))[0]  # the same 5 children as best_of=5
    best = engine.generate([prompt], sampled(n=2, best_of=5, seed=99))[0]

    def hf_logprob(tokens: tuple[int, ...]) -> float:
        with torch.no_grad():
            logits = hf(torch.tensor([prompt + list(tokens)])).logits[0, len(prompt) - 1 : -1]
        return float(logits.log_softmax(-1).gather(1, torch.tensor(tokens).unsqueeze(1)).sum())

    ranked = sorted(token_ids(pool), key=hf_logprob, reverse=True)
    assert token_ids(best) == ranked[:2]
    assert [o.index for o in best.outputs] == [0, 1]
    for o in best.outputs:
        assert o.cumulative_logprob == pytest.approx(hf_logprob(o.token_ids), abs=1e-4)
        assert o.logprobs is None  # computed for the ranking, not shown unless asked
    assert_no_leaks(engine)


def test_preempted_sample_group_equals_uninterrupted_run(tmp_path) -> None:
    prompt = random_prompts(1, (24, 24), seed=26)[0]
    params = sampled(n=4, seed=8, max_tokens=20)
    final, preemptions, small = run_beside_a_long_request(
        tmp_path / "m", "n4", prompt, params, seed=25
    )
    assert preemptions >= 1, "the group was never preempted; shrink the cache"
    alone = tiny_engine(tmp_path / "m").generate([prompt], params)[0]
    assert token_ids(final) == token_ids(alone)
    assert_no_leaks(small)


def test_a_group_that_ends_unevenly_reports_each_sample(tmp_path) -> None:
    engine = tiny_engine(tmp_path)
    prompt = random_prompts(1, (5, 5), seed=27)[0]
    common = sampled(n=4, seed=5, max_tokens=20, ignore_eos=False)
    probe = engine.generate([prompt], common)[0]
    stop = probe.outputs[1].token_ids[2]  # sample 1 meets it by its third token
    out = engine.generate([prompt], dataclasses.replace(common, stop_token_ids=(stop,)))[0]
    lengths = [len(o.token_ids) for o in out.outputs]
    assert lengths[1] <= 3 and out.outputs[1].finish_reason == "stop"
    for o, p in zip(out.outputs, probe.outputs, strict=True):  # each is its probe, cut at the stop
        assert o.token_ids == p.token_ids[: len(o.token_ids)]
        assert o.token_ids == p.token_ids or o.token_ids[-1] == stop
    assert_no_leaks(engine)


def test_aborted_groups_report_every_index_forked_or_not(tmp_path) -> None:
    engine = tiny_engine(tmp_path, max_num_seqs=4)
    engine.add_request("a", [5, 6, 7], sampled(n=4, max_tokens=30))
    engine.add_request("b", [8, 9], sampled(n=3))  # waits unforked: no batch rows left
    engine.step()
    engine.abort_request("b")
    engine.abort_request("a")
    outs = {o.request_id: o for o in engine.step()}
    assert [o.index for o in outs["b"].outputs] == [0, 1, 2]
    assert [o.index for o in outs["a"].outputs] == [0, 1, 2, 3]
    assert all(o.finish_reason == "abort" for out in outs.values() for o in out.outputs)
    assert_no_leaks(engine)
