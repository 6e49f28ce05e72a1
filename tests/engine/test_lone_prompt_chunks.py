"""The step-time target never starves a lone prompt (issue 39, item 9).

A slowed fake runner stands for a contended 2-core CPU (each step lasts a fixed 0.25 s plus
15 ms a token plus 2 us a query x key pair, on a fake clock the engine's own step timer reads),
so the engine's real cost model learns that profile from a few ordinary requests. Then a
streamed 1,500-token prompt arrives alone: with the default 100 ms target it is prefilled in
one step, as with the target off (before: chunks of ~40 tokens, 40 steps, as the issue saw).
The oracle for "one step" is the budget: max_num_batched_tokens (2048) holds the prompt.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

import engine.step_pipeline as step_pipeline_module
from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.sampling_params import SamplingParams
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.step_cost import chunk_pairs
from tests.engine.test_step_overhead import ByteTokenizer, CyclingRunner

FIXED_S, PER_ROW_S, PER_PAIR_S = 0.25, 0.015, 2e-6
MAX_LEN = 4096


class SlowRunner(CyclingRunner):
    """CyclingRunner whose steps take the contended profile's time on `clock`; it records the
    prefill chunk each request got per step."""

    def __init__(self, clock: SimpleNamespace) -> None:
        super().__init__()
        self.clock = clock
        self.chunks: dict[str, list[int]] = {}

    def execute(self, chunks, block_copies=(), sampling=None):
        rows = sum(c.num_new_tokens for c in chunks)
        pairs = sum(chunk_pairs(c.start, c.num_new_tokens) for c in chunks)
        self.clock.now += FIXED_S + PER_ROW_S * rows + PER_PAIR_S * pairs
        for c in chunks:
            if c.start < c.seq.num_prompt_tokens:
                self.chunks.setdefault(c.request.request_id, []).append(c.num_new_tokens)
        return super().execute(chunks, block_copies, sampling)


@pytest.fixture
def slow_engine(monkeypatch) -> tuple[Engine, SlowRunner]:
    clock = SimpleNamespace(now=0.0)
    fake_time = SimpleNamespace(perf_counter=lambda: clock.now, time=time.time)
    monkeypatch.setattr(step_pipeline_module, "time", fake_time)  # the engine times its steps on it
    config = EngineConfig(block_size=16, max_model_len=MAX_LEN, max_num_seqs=4)
    scheduler = Scheduler(config, BlockManager(MAX_LEN // 16 + 8, 16, False), MAX_LEN)
    runner = SlowRunner(clock)
    return Engine(runner, scheduler, ByteTokenizer(), config, "slow", ()), runner


def run(engine: Engine, rid: str, prompt_len: int, max_tokens: int) -> None:
    prompt = [1 + i % 60 for i in range(prompt_len)]
    params = SamplingParams(max_tokens=max_tokens, temperature=0.0, ignore_eos=True)
    engine.add_request(rid, prompt, params)
    while engine.has_unfinished_requests():
        engine.step()


def test_a_lone_long_prompt_on_a_slow_machine_is_prefilled_in_one_step(slow_engine):
    engine, runner = slow_engine
    for i, length in enumerate((40, 120, 300)):  # teach the cost model the machine's speed
        run(engine, f"warm{i}", length, 6)
    model = engine.scheduler.cost_model
    assert model.ready
    assert model.predict(100, 10_000) == pytest.approx(
        FIXED_S + PER_ROW_S * 100 + PER_PAIR_S * 10_000, rel=1e-3
    )  # it learned the profile: the old 1 s bound would now cut the prompt into ~40 chunks
    run(engine, "lone", 1500, 2)
    assert runner.chunks["lone"] == [1500]
