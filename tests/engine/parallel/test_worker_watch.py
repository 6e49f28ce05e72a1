"""Rank 0's watch over the group (engine/parallel/workers.py), with a stand-in membership:
a silent rank is reported once; when the engine then stops the group, the process lives on;
when it does not (its step waits in a collective on a peer that is cut off), the watch ends
the process with code 1 after the grace period instead of leaving it unhealthy for minutes.
While the group forms (`guard_start`: torch.distributed's init cannot be interrupted), a rank
that is gone, or a group not formed by the deadline, ends the process at once, the local
ranks killed; a group that forms in time is left alone."""

from __future__ import annotations

import subprocess
import sys
import threading
import time

import pytest

from engine.parallel import workers
from engine.parallel.workers import WorkerSet


class _AliveNode:
    """A stand-in membership: every rank's process lives and beats."""

    def gone(self) -> str | None:
        return None

    def stale(self) -> str | None:
        return None

    def close(self) -> None:
        pass


class _SilentNode(_AliveNode):
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


class _GoneNode(_AliveNode):
    def gone(self) -> str:
        return "node 1 (rank 3) closed its connection to rank 0: its process ended"


def _forming(members: object, timeout: float, body_s: float) -> tuple[list[int], bool]:
    """Runs a start-up guard around a body of `body_s` seconds (the init that would wait) with
    one local rank process; returns the exit codes asked for and whether that rank was killed."""
    exits: list[int] = []
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    group = WorkerSet({1: proc}, members, exit_process=exits.append)
    try:
        with group.guard_start(timeout):
            time.sleep(body_s)
        time.sleep(0.2)  # a guard that outlived its body would act now
        return exits, proc.poll() is not None
    finally:
        proc.kill()
        proc.wait()


def test_a_rank_gone_while_the_group_forms_ends_the_process_at_once(caplog) -> None:
    exits, killed = _forming(_GoneNode(), timeout=60.0, body_s=0.5)
    assert exits == [1] and killed
    assert "node 1 (rank 3) closed its connection to rank 0" in caplog.text


def test_a_group_not_formed_by_the_deadline_ends_the_process(caplog) -> None:
    exits, killed = _forming(_AliveNode(), timeout=0.2, body_s=0.6)
    assert exits == [1] and killed
    assert "the process group did not form within 0.2s" in caplog.text


def test_a_group_formed_in_time_is_left_alone() -> None:
    exits, killed = _forming(_AliveNode(), timeout=0.5, body_s=0.1)
    assert exits == [] and not killed
    assert not any(t.name == "tgserve-group-start" for t in threading.enumerate())
