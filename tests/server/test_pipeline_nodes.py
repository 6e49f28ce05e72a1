"""`tgserve serve --pipeline-parallel-size 2 --nnodes 2`: the model's layers in two stages on
two machines, each a network namespace made by the test (tests/netns.py), the stages reaching
each other only through their own 10.x addresses, over gloo.

Guarantees defended: greedy and seeded text through HTTP equals the one-process engine's
(node 0 holds the embedding, the first stage's layers and the LM head; node 1 the last stage's
layers and the final norm), at PP=2 and at TP=2 x PP=2 (a stage of two ranks per machine,
4 processes); node 1 killed while a stream decodes (PP=2), or idle (TP=2 x PP=2), ends node 0
(exit non-zero; the stream's connection closed or its request ended) within a bound instead
of hanging. One group per
parallel layout serves its cases: starting one is the cost.
"""

from __future__ import annotations

import time

import httpx
import pytest

from tests import netns
from tests.server.server_group import wait_ready
from tests.server.test_multi_node import (
    PORT,
    SEEDED,
    _node,
    _stream_started,
    _texts,
    solo,  # noqa: F401 (the fixture: the one-process engine's texts)
)

KILLED_BOUND_S = 30.0  # the pending receive sees the closed connection; + a busy host's slack
STAGES = ("--pipeline-parallel-size", "2")

pytestmark = pytest.mark.skipif(
    (reason := netns.unavailable()) is not None, reason=f"no network namespaces: {reason}"
)


def test_two_stages_on_two_nodes_same_text_and_a_killed_stage_ends_the_group(
    tiny_model_folder,
    solo,  # noqa: F811 (the fixture imported above)
    tmp_path,
) -> None:
    with netns.hosts(2) as hosts:
        client = httpx.Client(base_url=f"http://{hosts.client_addr}:{PORT}", trust_env=False)
        logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
        node0 = _node(hosts, 0, tiny_model_folder, logs[0], sizes=STAGES)
        node1 = _node(hosts, 1, tiny_model_folder, logs[1])
        wait_ready(client, node0, logs[0])
        assert _texts(client, {"temperature": 0}) == solo["greedy"]
        assert _texts(client, SEEDED) == solo["seeded"]
        reader, events = _stream_started(hosts, logs[0])
        node1.kill()  # the last stage, mid-stream: a step waits on its hidden states
        t0 = time.monotonic()
        code = node0.wait(KILLED_BOUND_S)
        ended_after = time.monotonic() - t0
        reader.join(10)
    log = logs[0].read_text()
    assert code not in (0, None) and ended_after < KILLED_BOUND_S, log
    assert "pipeline stages" in log  # it ran as a pipeline (the start-up line says so)
    assert not reader.is_alive() and events[-1] in ("cut", "data: [DONE]"), events[-3:]


def test_two_stages_of_two_ranks_on_two_nodes_same_text(tiny_model_folder, solo, tmp_path) -> None:  # noqa: F811
    sizes = ("--tensor-parallel-size", "2", *STAGES)
    with netns.hosts(2) as hosts:
        client = httpx.Client(base_url=f"http://{hosts.client_addr}:{PORT}", trust_env=False)
        logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
        node0 = _node(hosts, 0, tiny_model_folder, logs[0], sizes=sizes)
        node1 = _node(hosts, 1, tiny_model_folder, logs[1])
        wait_ready(client, node0, logs[0])
        assert _texts(client, {"temperature": 0}) == solo["greedy"]
        assert _texts(client, SEEDED) == solo["seeded"]
        node1.kill()  # idle, the process holding rank 2 (rank 3 is its child)
        t0 = time.monotonic()
        code = node0.wait(KILLED_BOUND_S)
        ended_after = time.monotonic() - t0
    log = logs[0].read_text()
    assert "tensor parallel over 2 ranks in each of 2 pipeline stages" in log
    assert code not in (0, None) and ended_after < KILLED_BOUND_S, log
    assert "node 1 (rank 2) closed its connection to rank 0" in log
