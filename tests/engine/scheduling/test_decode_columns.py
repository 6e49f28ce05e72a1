"""The steady decode step as columns (engine/scheduling/decode_columns.py) schedules and answers
as the general decode pass does. The oracle is the same run with the columns switched off
(`KeptColumns.of` keeping no order): every step's chunks and every output equal, synchronous
and overlapped, through a late arrival, requests ending at different steps, an n = 2 group
and preemptions in a small cache, and the totals the prefill budget is sized from; and most
steady steps did take the columns."""

from __future__ import annotations

import pytest

from engine import EngineConfig, SamplingParams
from engine.engine import Engine
from engine.fake_device import FakeDeviceRunner
from engine.scheduling import decode_columns
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.decode_columns import DecodeColumns
from engine.scheduling.scheduler import Scheduler
from engine.scheduling.step_builder import StepBuilder

_PREFILL_BUDGET = StepBuilder._prefill_budget


def _engine(overlapped: bool, blocks: int) -> Engine:
    config = EngineConfig(
        block_size=4,
        max_num_seqs=8,
        max_num_batched_tokens=256,
        max_model_len=128,
        async_scheduling=overlapped,
        target_itl_ms=None,
    )
    runner = FakeDeviceRunner(256, 0.0, 128, config.seed)
    manager = BlockManager(blocks, config.block_size, True)
    return Engine(runner, Scheduler(config, manager, 128), None, config, "fake", ())


def _params(i: int) -> SamplingParams:
    new = 12 + 5 * (i % 4)
    if i == 3:
        return SamplingParams(max_tokens=6, temperature=0.8, seed=i, n=2, ignore_eos=True)
    if i % 3 == 1:
        return SamplingParams(max_tokens=new, temperature=0.7, seed=i, logprobs=1, ignore_eos=True)
    return SamplingParams(max_tokens=new, temperature=0.0, ignore_eos=True, streamed=i % 2 == 0)


def _run(overlapped: bool, blocks: int, monkeypatch) -> tuple[list, list, int, int]:
    engine = _engine(overlapped, blocks)
    schedules, outputs, columns = [], [], 0
    schedule = engine.scheduler.schedule

    def totals(builder: StepBuilder):  # what the prefill budget is sized from
        schedules.append((builder.budget, builder.pairs, builder.delivering, builder.decode_tokens))
        return _PREFILL_BUDGET(builder)

    monkeypatch.setattr(StepBuilder, "_prefill_budget", totals)

    def spy():
        nonlocal columns
        out = schedule()
        columns += type(out.chunks) is DecodeColumns
        schedules.append(
            [(c.request.request_id, c.seq.seq_id, c.start, c.sample) for c in out.chunks]
        )
        return out

    engine.scheduler.schedule = spy
    for i in range(7):
        engine.add_request(str(i), [1 + (7 * i + k) % 200 for k in range(5 + 3 * i)], _params(i))
    steps = 0
    try:
        while engine.has_unfinished_requests():
            for o in engine.step():
                c = [(x.index, x.token_ids, x.logprobs, x.finish_reason) for x in o.outputs]
                outputs.append((o.request_id, o.finished, c))
            steps += 1
            if steps == 15:  # a late arrival changes the running set in the steady state
                engine.add_request("late", list(range(1, 9)), _params(0))
    finally:
        engine.close()
    return schedules, outputs, columns, engine.stats().num_preemptions


@pytest.mark.parametrize("overlapped", [False, True], ids=["synchronous", "overlapped"])
@pytest.mark.parametrize("blocks", [400, 20], ids=["roomy", "preempting"])
def test_columns_schedule_and_answer_as_the_general_pass(overlapped, blocks, monkeypatch):
    schedules, outputs, columns, preemptions = _run(overlapped, blocks, monkeypatch)
    with monkeypatch.context() as m:
        m.setattr(decode_columns.KeptColumns, "of", classmethod(lambda cls, *a: None))
        general = _run(overlapped, blocks, m)
    assert general[2] == 0 and columns >= 10  # the switch held, and columns were taken
    assert (blocks == 20) == (preemptions > 0) and preemptions == general[3]
    assert schedules == general[0]
    assert outputs == general[1]
