"""A parallel group whose rank ends while the group forms: rank 0 fails, naming the rank, in
bounded time instead of waiting inside torch.distributed's init for the collective timeout.

The fault is the test-only hook of engine/parallel/membership.py: the rank named by
TGSERVE_FAULT_EXIT_AFTER_JOIN ends its process (code 3) right after checking in, so rank 0
has seen every rank join and goes on to form the process group with a rank that is gone
(what a start-up heartbeat timeout on a loaded host once did, leaving rank 0 stuck there for
the 5-minute collective timeout). Cases: TP=2 on one machine (the rank is a local process),
and TP=2 x PP=2 over two network namespaces (the rank is the second one node 1 starts, so
rank 0 knows it only through its closed connection); node 1 ends too.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from engine.parallel.membership import FAULT_EXIT_AFTER_JOIN
from models.parallel import free_port
from tests import netns
from tests.server.test_multi_node import ROOT, SERVE, _node

# Rank 0's whole life here: a server's start (torch imported in every process of a busy
# 2-core host) up to the failure; before the fix it waited 300 s in init_process_group.
FAIL_BOUND_S = 90.0


def _ended_within(proc: subprocess.Popen, bound: float, log: Path) -> int:
    try:
        return proc.wait(bound)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        pytest.fail(f"still running after {bound:.0f}s (a hang):\n{log.read_text()}")


def test_tp2_a_rank_gone_after_joining_fails_rank_0_naming_it(tiny_model_folder, tmp_path) -> None:
    log = tmp_path / "rank0.log"
    argv = [sys.executable, *SERVE.split(), "--model", str(tiny_model_folder)]
    argv += ["--tensor-parallel-size", "2", "--port", str(free_port())]
    env = {**os.environ, FAULT_EXIT_AFTER_JOIN: "1"}
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=out, env=env, text=True)
    code = _ended_within(proc, FAIL_BOUND_S, log)
    text = log.read_text()
    assert code not in (0, None), text
    assert "rank 1 (pid" in text and "exited with 3" in text, text


@pytest.mark.skipif(
    (reason := netns.unavailable()) is not None, reason=f"no network namespaces: {reason}"
)
def test_tp2_pp2_a_remote_rank_gone_after_joining_fails_both_nodes(
    tiny_model_folder, tmp_path
) -> None:
    sizes = ("--tensor-parallel-size", "2", "--pipeline-parallel-size", "2")
    logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
    fault = {FAULT_EXIT_AFTER_JOIN: "3"}  # node 1's second rank, a process node 1 starts
    with netns.hosts(2) as hosts:
        node0 = _node(hosts, 0, tiny_model_folder, logs[0], sizes=sizes)
        node1 = _node(hosts, 1, tiny_model_folder, logs[1], env={**os.environ, **fault})
        t0 = time.monotonic()
        code0 = _ended_within(node0, FAIL_BOUND_S, logs[0])
        code1 = _ended_within(node1, FAIL_BOUND_S - (time.monotonic() - t0) + 30, logs[1])
    text = logs[0].read_text()
    assert code0 not in (0, None) and code1 not in (0, None), text
    assert "node 1 (rank 3) closed its connection to rank 0" in text, text
