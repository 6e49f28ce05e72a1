"""Where a group's ranks run (engine/parallel/cluster.py) and how its members find each other
(engine/parallel/membership.py), on hand-worked cases: the node of each rank, torchrun's
variables read as its launcher sets them, bad values named; on a real rendezvous store in this
process: the missing nodes named by rank, a rank whose heartbeat stops named (after the short
timeout only once it serves: the init timeout while it starts), a rank whose process ends (its
liveness connection closed) named at once, a joining rank given rank 0's config, beats that go
on while the rank's store waits (torch.distributed's init waits there for the slowest rank)."""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from datetime import timedelta

import pytest
import torch.distributed as dist

from engine.config import EngineConfig
from engine.parallel import membership
from engine.parallel.cluster import Cluster
from engine.parallel.membership import Membership, RendezvousError
from models.parallel import free_port


def test_each_node_holds_an_equal_slice_of_the_ranks() -> None:
    cluster = Cluster(nnodes=2, node_rank=1, master_addr="10.0.0.1", master_port=29500)
    assert list(cluster.ranks_on(0, 4)) == [0, 1] and list(cluster.ranks_on(1, 4)) == [2, 3]
    assert [cluster.node_of(r, 4) for r in range(4)] == [0, 0, 1, 1]
    assert cluster.local_ranks(4) == [2, 3] and not cluster.is_leader
    assert Cluster(nnodes=2, master_port=1).is_leader
    with pytest.raises(ValueError, match="multiple of --nnodes 2"):
        cluster.check_world(3)


def test_torchrun_variables_give_one_process_per_rank() -> None:
    environ = {
        "RANK": "3",
        "WORLD_SIZE": "4",
        "LOCAL_WORLD_SIZE": "2",
        "LOCAL_RANK": "1",
        "GROUP_RANK": "1",
        "MASTER_ADDR": "leader.svc",
        "MASTER_PORT": "29400",
        "TORCHELASTIC_USE_AGENT_STORE": "True",
    }
    cluster = Cluster.from_environ({"init_timeout_s": None}, environ)
    assert (cluster.nnodes, cluster.node_rank, cluster.rank, cluster.world_size) == (2, 1, 3, 4)
    assert (cluster.master_addr, cluster.master_port) == ("leader.svc", 29400)
    assert cluster.agent_store and cluster.local_ranks(4) == [3] and not cluster.is_leader
    leader = Cluster.from_environ({}, {**environ, "RANK": "0"})
    assert leader.is_leader and leader.local_ranks(4) == [0]


def test_flags_win_over_the_environment_and_bad_values_are_named() -> None:
    environ = {"MASTER_ADDR": "a", "MASTER_PORT": "1", "NODE_RANK": "1"}
    cluster = Cluster.from_environ({"nnodes": 2, "master_addr": "b", "node_rank": None}, environ)
    assert (cluster.master_addr, cluster.master_port, cluster.node_rank) == ("b", 1, 1)
    with pytest.raises(ValueError, match="MASTER_PORT must be an integer"):
        Cluster.from_environ({}, {"MASTER_PORT": "x"})
    with pytest.raises(ValueError, match="--node-rank must be in"):
        Cluster(nnodes=2, node_rank=2, master_port=1)
    with pytest.raises(ValueError, match="needs --master-port"):
        Cluster(nnodes=2)


def _cluster(timeout: float) -> Cluster:
    return Cluster(
        nnodes=2, master_addr="127.0.0.1", master_port=free_port(), init_timeout_s=timeout
    )


def test_rank_zero_names_the_missing_node_and_its_ranks() -> None:
    cluster = _cluster(0.5)
    config = EngineConfig(tensor_parallel_size=4, max_num_seqs=3)
    leader = Membership.lead(cluster, 4, config)
    follower = Cluster(**{**cluster.__dict__, "node_rank": 1})
    joined, got = Membership.join(Cluster(**{**cluster.__dict__, "node_rank": 0}), 1)
    assert got == config and joined.rank == 1  # rank 0's config, as published
    with pytest.raises(RendezvousError, match=r"node 1 \(ranks 2, 3\) never joined"):
        leader.await_joined()
    first, _ = Membership.join(follower)  # a node's first rank: found from rank 0's config
    assert first.rank == 2
    with pytest.raises(RendezvousError, match="rank 3 exited with 1 before the group was formed"):
        leader.await_joined(lambda: "rank 3 exited with 1")


def test_a_silent_rank_is_named_by_its_node(monkeypatch) -> None:
    monkeypatch.setattr(membership, "HEARTBEAT_TIMEOUT_S", 0.3)
    cluster = _cluster(5.0)
    leader = Membership.lead(cluster, 2, EngineConfig(tensor_parallel_size=2))
    follower, _ = Membership.join(Cluster(**{**cluster.__dict__, "node_rank": 1}))
    follower.store.add("tgserve/beat/1", 1)
    assert leader.stale() is None
    time.sleep(0.4)  # silent past the heartbeat timeout, but still starting: 5 s allowed
    assert leader.stale() is None
    follower.serving()
    time.sleep(0.4)
    follower.store.add("tgserve/beat/1", 1)
    assert leader.stale() is None  # it beat since the last look
    time.sleep(0.4)
    assert leader.stale().startswith("node 1 (rank 1) stopped answering: no heartbeat for 0.")


def test_a_rank_whose_process_ends_is_named_at_once() -> None:
    cluster = _cluster(5.0)
    leader = Membership.lead(cluster, 4, EngineConfig(tensor_parallel_size=4))
    node1 = Cluster(**{**cluster.__dict__, "node_rank": 1})
    ranks = [Membership.join(node1, rank)[0] for rank in (2, 3)]
    host, port = leader.store.get("tgserve/liveness").decode().rsplit(":", 1)
    with socket.create_connection((host, int(port))) as stray:  # not a rank: never counts
        stray.sendall(b"GET / HTTP/1.1\r\n\r\n")
    time.sleep(0.3)
    assert leader.gone() is None
    ranks[1]._link.close()  # what the kernel does when rank 3's process ends, however
    deadline = time.monotonic() + 5.0
    while leader.gone() is None and time.monotonic() < deadline:
        time.sleep(0.01)
    assert leader.gone() == ("node 1 (rank 3) closed its connection to rank 0: its process ended")
    with pytest.raises(RendezvousError, match=r"node 1 \(rank 3\) closed its connection"):
        leader.await_joined()  # rank 1 never came either: the end is said at once
    node0 = Cluster(**{**cluster.__dict__, "node_rank": 0})
    for member in (Membership.join(node0, 1)[0], ranks[0]):
        member.mark_stopped()
    leader.await_stopped(2.0)  # ranks 1 and 2 acknowledged; rank 3's process ended: none due
    leader.close()


def test_beats_go_on_while_the_rank_waits_on_the_store(monkeypatch) -> None:
    monkeypatch.setattr(membership, "HEARTBEAT_S", 0.05)
    cluster = _cluster(5.0)
    leader = Membership.lead(cluster, 2, EngineConfig(tensor_parallel_size=2))
    follower, _ = Membership.join(Cluster(**{**cluster.__dict__, "node_rank": 1}))
    lost: list[str] = []
    follower.start_heartbeat(lost.append)
    follower.store.set_timeout(timedelta(seconds=1.5))

    def wait_for_a_slow_rank() -> None:  # what init_process_group does: a blocking wait
        with contextlib.suppress(dist.DistError):  # it times out: no rank sets the key
            follower.store.wait(["tgserve/a-key-no-one-sets"])

    waiter = threading.Thread(target=wait_for_a_slow_rank)
    waiter.start()
    time.sleep(0.2)  # the wait holds the store's connection now
    before = leader.beats.add("tgserve/beat/1", 0)
    time.sleep(0.8)
    during = leader.beats.add("tgserve/beat/1", 0)
    waiter.join()
    follower.mark_stopped()
    assert during - before >= 5 and lost == []  # ~16 beats of 0.05 s in 0.8 s
    leader.close()
