"""Rank 0's watch over the group (engine/parallel/workers.py), with a stand-in membership:
a silent rank is reported once; when the engine then stops the group, the process lives on;
when it does not (its step waits in a collective on a peer that is cut off), the watch ends
the process with code 1 after the grace period instead of leaving it unhealthy for minutes."""

from __future__ import annotations

import time

import pytest

from engine.parallel import workers
from engine.parallel.workers import WorkerSet


class _SilentNode:
    def stale(self) -> str:
        return "node 1 (rank 1) stopped answering: no heartbeat for 10.0s"


@pytest.fixture(autouse=True)
def _fast(monkeypatch) -> None:
    monkeypatch.setattr(workers, "POLL_SECONDS", 0.02)
    monkeypatch.setattr(workers, "STUCK_GRACE_S", 0.3)


def _watch(stop_on_failure: bool) -> tuple[list[str], list[int]]:
    failures: list[str] = []
    exits: list[int] = []
    group = WorkerSet({}, _SilentNode(), exit_process=exits.append)

    def on_failure(reason: str) -> None:
        failures.append(reason)
        if stop_on_failure:  # the engine's loop ended and closed the group
            group.stop(timeout=0.0)

    group.watch(on_failure)
    time.sleep(1.0)
    return failures, exits


def test_a_stuck_engine_ends_the_process_after_the_grace() -> None:
    failures, exits = _watch(stop_on_failure=False)
    assert failures == ["node 1 (rank 1) stopped answering: no heartbeat for 10.0s"]
    assert exits == [1]


def test_an_engine_that_stops_the_group_is_left_to_exit_itself() -> None:
    failures, exits = _watch(stop_on_failure=True)
    assert len(failures) == 1 and exits == []
