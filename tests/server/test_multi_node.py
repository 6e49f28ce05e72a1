"""`tgserve serve --nnodes 2`: tensor parallel over two machines, each a network namespace
made by the test (tests/netns.py), the ranks reaching each other only through their own
10.x addresses, over gloo.

Guarantees defended: a node that comes late joins (rank 0 waits for it); greedy and seeded
text through HTTP equals the one-process engine's; node 1 keeps serving through a SIGTERM
(rank 0 drains first, then stops it); node 1 killed while the server is idle
makes node 0's /health fail within a bound and node 0 exit non-zero naming the node (its
liveness connection closed); node 1 cut off (its link down: no connection closes) while a stream
decodes ends node 0 (exit 1, the reason logged, the stream's connection closed) in bounded
time instead of the collective timeout's minutes; node 1 with no node 0 waits --dist-init-timeout, then fails naming the
address it could not reach, and node 0 with no node 1 fails naming the missing node (neither
hangs). One group (two processes of torch) serves every HTTP case: starting one is the cost.
"""

from __future__ import annotations

import signal
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

from tests import netns
from tests.server.server_group import solo_texts, wait_ready

ROOT = Path(__file__).resolve().parents[2]
PROMPTS = ["Hello world! How are", "The quick brown fox"]
MAX_TOKENS = 16
SEEDED = {"temperature": 0.9, "seed": 7}
PORT, MASTER_PORT = 8000, 29500  # inside the namespaces: nothing else listens there
HEALTH_BOUND_S = 20.0  # the closed liveness connection (at once) + polling + a busy host
STUCK_BOUND_S = 45.0  # + the 10 s grace a stuck step gets, + slack (the collective waits 5 min)

pytestmark = pytest.mark.skipif(
    (reason := netns.unavailable()) is not None, reason=f"no network namespaces: {reason}"
)


SERVE = "-m server.cli serve --kv-cache-memory 4MB --block-size 4 --dtype float32 "
SERVE += "--max-num-seqs 8 --shutdown-timeout 10"


def _node(
    hosts: netns.Hosts,
    node: int,
    model: Path,
    log: Path,
    *flags: str,
    sizes: tuple[str, ...] = ("--tensor-parallel-size", "2"),
    env: dict[str, str] | None = None,
):
    """`sizes`: node 0's parallel sizes (the other nodes take rank 0's); `env`: the process's
    environment (None: this one's)."""
    argv = [sys.executable, *SERVE.split(), "--model", str(model), "--nnodes", "2"]
    argv += ["--node-rank", str(node), "--master-addr", hosts.addr[0]]
    argv += ["--master-port", str(MASTER_PORT), *flags]
    if node == 0:
        argv += [*sizes, "--host", "0.0.0.0", "--port", str(PORT)]
    with log.open("w") as out:  # the process holds its own copy
        return hosts.run(node, argv, cwd=ROOT, stdout=out, stderr=out, text=True, env=env)


def _texts(client: httpx.Client, extra: dict) -> list[str]:
    texts = []
    for prompt in PROMPTS:
        body = {"prompt": prompt, "max_tokens": MAX_TOKENS, **extra}
        reply = client.post("/v1/completions", json=body, timeout=60)
        assert reply.status_code == 200, reply.text
        texts.append(reply.json()["choices"][0]["text"])
    return texts


@pytest.fixture(scope="module")
def solo(tiny_model_folder) -> dict[str, list[str]]:
    """The one-process engine's greedy and seeded texts: the oracle."""
    return solo_texts(tiny_model_folder, PROMPTS, MAX_TOKENS, SEEDED, max_num_seqs=8)


def test_two_nodes_same_text_and_a_killed_node_fails_health_in_bounded_time(
    tiny_model_folder, solo, tmp_path
) -> None:
    with netns.hosts(2) as hosts:
        client = httpx.Client(base_url=f"http://{hosts.client_addr}:{PORT}", trust_env=False)
        logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
        node0 = _node(hosts, 0, tiny_model_folder, logs[0])
        time.sleep(2)  # node 1 comes late: rank 0 waits for it
        node1 = _node(hosts, 1, tiny_model_folder, logs[1])
        wait_ready(client, node0, logs[0])
        assert _texts(client, {"temperature": 0}) == solo["greedy"]
        assert _texts(client, SEEDED) == solo["seeded"]
        node1.send_signal(signal.SIGTERM)  # ignored: node 1 serves until rank 0 stops it
        assert _texts(client, {"temperature": 0}) == solo["greedy"]
        assert client.get("/health").status_code == 200
        node1.kill()  # idle: no step in flight, only its closed liveness connection tells
        t0 = time.monotonic()
        while time.monotonic() - t0 < HEALTH_BOUND_S:
            try:
                if client.get("/health", timeout=2).status_code != 200:
                    break
            except httpx.TransportError:  # node 0 has exited already: health failed too
                break
            time.sleep(0.2)
        failed_after = time.monotonic() - t0
        code = node0.wait(30)
    log = logs[0].read_text()
    assert failed_after < HEALTH_BOUND_S, log
    assert code not in (0, None), log
    assert "node 1 (rank 1) closed its connection to rank 0" in log


def test_a_node_cut_off_mid_stream_ends_node_0_in_bounded_time(tiny_model_folder, tmp_path) -> None:
    with netns.hosts(2) as hosts:
        client = httpx.Client(base_url=f"http://{hosts.client_addr}:{PORT}", trust_env=False)
        logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
        node0 = _node(hosts, 0, tiny_model_folder, logs[0])
        node1 = _node(hosts, 1, tiny_model_folder, logs[1])
        wait_ready(client, node0, logs[0])
        reader, events = _stream_started(hosts, logs[0])
        hosts.cut(1)  # a partition: the step in flight waits on node 1 and sees no close
        t0 = time.monotonic()
        code = node0.wait(STUCK_BOUND_S)
        ended_after = time.monotonic() - t0
        reader.join(10)
        node1.wait(30)  # its heartbeat cannot reach rank 0's store either
    log = logs[0].read_text()
    assert code == 1 and ended_after < STUCK_BOUND_S, log
    assert "node 1 (rank 1) stopped answering" in log and "ending this process" in log
    assert not reader.is_alive() and events[-1] == "cut"


def _stream_started(hosts: netns.Hosts, log: Path) -> tuple[threading.Thread, list[str]]:
    """A long stream read by a thread into `events` (its last "cut" if the connection
    breaks), returned once its first 3 events came."""
    events: list[str] = []
    body = {"prompt": PROMPTS[0], "max_tokens": 230, "stream": True, "ignore_eos": True}
    url = f"http://{hosts.client_addr}:{PORT}/v1/completions"
    reader = threading.Thread(target=_read_until_cut, args=(url, body, events))
    reader.start()
    deadline = time.monotonic() + 60
    while len(events) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert len(events) >= 3, log.read_text()
    return reader, events


def _read_until_cut(url: str, body: dict, sink: list[str]) -> None:
    try:
        with httpx.stream("POST", url, json=body, timeout=120, trust_env=False) as response:
            for line in response.iter_lines():
                if line and not line.startswith(":"):
                    sink.append(line)
    except httpx.TransportError:
        sink.append("cut")


def test_a_node_that_never_comes_is_named_and_a_missing_leader_too(
    tiny_model_folder, tmp_path
) -> None:
    with netns.hosts(2) as hosts:
        logs = [tmp_path / "node0.log", tmp_path / "node1.log"]
        timeout = ("--dist-init-timeout", "3")
        node1 = _node(hosts, 1, tiny_model_folder, logs[1], *timeout)
        assert node1.wait(60) == 1  # it waited for rank 0's rendezvous, then gave up
        node0 = _node(hosts, 0, tiny_model_folder, logs[0], *timeout)
        assert node0.wait(60) == 1
    assert "node 1 (rank 1) never joined" in logs[0].read_text()
    assert f"could not reach rank 0's rendezvous at {hosts.addr[0]}:{MASTER_PORT}" in (
        logs[1].read_text()
    )
