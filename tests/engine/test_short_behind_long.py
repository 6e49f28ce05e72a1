"""A short request sent while long prompts prefill is scheduled in the step after it arrives,
on the real default model at default flags, whatever the long prompts' and its own `stream`
setting: its first (and only) token comes from that step, the long prompts' chunks in it are
held back to what the step-time target leaves (they filled far larger steps before it; on a
machine too slow for that, only the anchor's amortised floor is left of them), and its
token is the one it gets alone (the oracle: the same greedy request run alone afterwards)."""

from __future__ import annotations

import random

import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.sampling_params import SamplingParams
from engine.scheduling.prefill_budget import BACKGROUND_OVER_BASE
from engine.scheduling.step_cost import chunk_pairs
from tests.devices import default_model_here

LONG_LEN = 1536  # 4 of them: 6144 prompt tokens, three 2048-token budgets: two steps leave most
SHORT_LEN = 5


@pytest.fixture(scope="module")
def engine() -> Engine:
    built = Engine.from_model(
        str(default_model_here()), EngineConfig(kv_cache_memory_bytes=400 * 2**20)
    )
    steps, models = [], []
    schedule = built.scheduler.schedule

    def recording_schedule():
        models.append(built.scheduler.cost_model.coefficients)  # what the step is sized with
        steps.append(schedule())
        return steps[-1]

    built.scheduler.schedule = recording_schedule
    built.recorded_steps = steps
    built.recorded_models = models
    return built


def prompt(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(100, 10_000) for _ in range(n)]


def greedy(streamed: bool) -> SamplingParams:
    return SamplingParams(max_tokens=1, temperature=0.0, ignore_eos=True, streamed=streamed)


@pytest.mark.parametrize("long_streamed", [False, True])
@pytest.mark.parametrize("short_streamed", [False, True])
def test_a_short_request_is_scheduled_in_the_step_after_it_arrives(
    engine, long_streamed, short_streamed
):
    rng = random.Random(f"{long_streamed}{short_streamed}")  # fresh prompts: no cache hits
    longs = [f"long{i}-{long_streamed}-{short_streamed}" for i in range(4)]
    for rid in longs:
        engine.add_request(rid, prompt(rng, LONG_LEN), greedy(long_streamed))
    for _ in range(2):  # the long prompts prefill alone (the first may finish: max_tokens 1)
        engine.step()
    long_steps = engine.recorded_steps[-2:]
    short_prompt = prompt(rng, SHORT_LEN)
    short = f"short-{long_streamed}-{short_streamed}"
    engine.add_request(short, short_prompt, greedy(short_streamed))
    outputs = {out.request_id: out for out in engine.step()}
    assert short in outputs and outputs[short].finished  # its token came from this step
    step = engine.recorded_steps[-1]
    assert set(longs) & {c.request.request_id for c in step.chunks}  # the oldest progresses
    sizes = [s.num_batched_tokens for s in long_steps]
    held = [c for c in step.chunks if c.request.request_id in longs]
    if step.num_batched_tokens - SHORT_LEN >= min(sizes):  # a slow (contended) machine, where
        # the long steps were small too: then only the anchor's amortised floor is there, a
        # chunk costing at most (BACKGROUND_OVER_BASE - 1) times the step's fixed part (issue 39)
        fixed, per_row, per_pair = engine.recorded_models[-1]
        [anchor] = held
        cost = per_row * anchor.num_new_tokens + per_pair * chunk_pairs(
            anchor.start, anchor.num_new_tokens
        )
        assert cost <= (BACKGROUND_OVER_BASE - 1) * fixed * (1 + 1e-9), (cost, fixed, sizes)
    for rid in longs:
        engine.abort_request(rid)
    while engine.has_unfinished_requests():
        engine.step()
    [alone] = engine.generate([short_prompt], greedy(False))
    assert outputs[short].outputs[0].token_ids == alone.outputs[0].token_ids
