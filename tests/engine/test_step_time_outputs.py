"""The step-time target changes how prompts are chunked, never what comes out: the same
staggered requests give the same greedy tokens with a 1 ms target (chunks cut to the floor
while streams decode), with priorities, and with the target off; the engine times its steps
and teaches the cost model (the scheduler's view in EngineStats). Offline batches are not
streamed, so a 1 ms target does not cut their chunks."""

from __future__ import annotations

from engine.requests.sampling_params import SamplingParams
from tests.engine.engine_fixtures import assert_no_leaks, random_prompts, run_staggered, tiny_engine


def test_outputs_do_not_depend_on_the_step_time_target_or_priority(tmp_path) -> None:
    prompts = random_prompts(8, (3, 90), seed=11)
    greedy = SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True)
    params = [greedy] * len(prompts)
    ranked = [
        SamplingParams(max_tokens=8, temperature=0.0, ignore_eos=True, priority=i % 3 - 1)
        for i in range(8)
    ]
    reference = run_staggered(
        tiny_engine(tmp_path, target_itl_ms=None, max_num_batched_tokens=64), prompts, params
    )
    tight = tiny_engine(tmp_path, target_itl_ms=1, max_num_batched_tokens=64)
    for run_params in (params, ranked, params):  # later runs: the cost model is fitted
        got = run_staggered(tight, prompts, run_params, arrive_every=2)
        for i, out in reference.items():
            assert got[i].outputs[0].token_ids == out.outputs[0].token_ids
    assert tight.scheduler.cost_model.ready
    stats = tight.stats()
    assert stats.step_seconds is not None and stats.step_seconds.count > 10
    assert stats.prefill_tokens_per_step.total >= sum(len(p) for p in prompts)
    assert 0 < stats.prefill_chunk_tokens <= 64  # the anchor's floor at least, the budget at most
    assert_no_leaks(tight)


def test_an_offline_batch_is_not_streamed_so_the_target_leaves_its_chunks_whole(tmp_path) -> None:
    prompts = random_prompts(4, (100, 120), seed=3)  # 400-480 tokens: one 512-token step
    greedy = SamplingParams(max_tokens=4, temperature=0.0, ignore_eos=True)
    engine = tiny_engine(tmp_path, target_itl_ms=1, max_num_batched_tokens=512)
    seen: list[bool] = []
    add = engine.add

    def recording_add(request) -> None:
        seen.append(request.params.streamed)
        add(request)

    engine.add = recording_add
    outs = engine.generate(prompts, greedy)
    assert seen == [False] * 4
    # every prompt whole in the first step, then 3 decode steps (a 1 ms target would cut them)
    assert engine.stats().step_seconds.count == 4
    reference = run_staggered(
        tiny_engine(tmp_path, target_itl_ms=None, max_num_batched_tokens=512), prompts, [greedy] * 4
    )
    for i, out in reference.items():
        assert outs[i].outputs[0].token_ids == out.outputs[0].token_ids
