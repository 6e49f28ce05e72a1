"""A request's timings: queue time ends when it is first scheduled, before its forward runs.

Oracle: a model runner slowed by a known delay. On an idle engine a request is scheduled at
once, so its queue time is far below the delay while its first token comes after it; a request
that waits behind another (one sequence at a time) queues at least as long as that one runs.
"""

from __future__ import annotations

import time

from engine.requests.sampling_params import SamplingParams
from tests.engine.engine_fixtures import tiny_engine

FORWARD_DELAY = 0.2


def _slowed(engine):
    execute = engine.runner.execute

    def slow_execute(*args, **kwargs):
        time.sleep(FORWARD_DELAY)
        return execute(*args, **kwargs)

    engine.runner.execute = slow_execute
    return engine


def _finals(engine) -> dict:
    finals = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                finals[out.request_id] = out
    return finals


def test_queue_time_on_an_idle_engine_excludes_the_forward(tmp_path) -> None:
    engine = _slowed(tiny_engine(tmp_path))
    engine.add_request("a", [5, 6, 7], SamplingParams(max_tokens=2, temperature=0.0))
    times = _finals(engine)["a"].metrics
    queued = times.first_scheduled_time - times.arrival_time
    assert 0 <= queued < FORWARD_DELAY / 2, queued
    assert times.first_token_time - times.arrival_time >= FORWARD_DELAY


def test_a_request_waiting_behind_another_queues_for_its_whole_run(tmp_path) -> None:
    engine = _slowed(tiny_engine(tmp_path, max_num_seqs=1))
    params = SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True)
    engine.add_request("first", [5, 6, 7], params)
    engine.add_request("second", [8, 9], params)
    finals = _finals(engine)
    first, second = finals["first"].metrics, finals["second"].metrics
    # "first" ran 3 steps of FORWARD_DELAY each before "second" could be scheduled
    assert second.first_scheduled_time >= first.finished_time - 1e-3
    assert second.first_scheduled_time - second.arrival_time >= 3 * FORWARD_DELAY
    assert first.first_scheduled_time - first.arrival_time < FORWARD_DELAY / 2
