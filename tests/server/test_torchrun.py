"""`torchrun --nproc-per-node 2 -m server.cli serve ...`: one process per rank, as torchrun's
launcher starts them (RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR / MASTER_PORT and its own
rendezvous store, TORCHELASTIC_USE_AGENT_STORE): rank 0 serves HTTP with tensor parallel over
both, rank 1 follows; greedy text equals the one-process engine's, and SIGTERM to torchrun
ends every process (torchrun forwards it: rank 0 drains and stops rank 1)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx

from engine import Engine, EngineConfig, SamplingParams
from tests.server.live import free_port
from tests.server.test_tensor_parallel import _alive, _children

ROOT = Path(__file__).resolve().parents[2]
PROMPT = "The quick brown fox"


def test_torchrun_ranks_serve_the_one_process_text(tiny_model_folder, tmp_path) -> None:
    config = EngineConfig(dtype="float32", device="cpu", block_size=4, max_num_seqs=8)
    greedy = SamplingParams(max_tokens=16, temperature=0.0)
    want = Engine.from_model(str(tiny_model_folder), config).generate([PROMPT], greedy)
    port, log = free_port(), tmp_path / "torchrun.log"
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node"]
    argv += ["2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()), "-m"]
    argv += ["server.cli", "serve", "--model", str(tiny_model_folder), "--host", "127.0.0.1"]
    argv += ["--port", str(port), "--kv-cache-memory", "4MB", "--block-size", "4"]
    argv += ["--dtype", "float32", "--max-num-seqs", "8", "--shutdown-timeout", "5"]
    ranks: list[int] = []
    with log.open("w") as out:
        proc = subprocess.Popen(argv, cwd=ROOT, stdout=out, stderr=out)
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 240
        while True:
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()
            try:
                if httpx.get(url + "/ready").status_code == 200:
                    break
            except httpx.TransportError:
                pass
            time.sleep(0.2)
        body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0}
        got = httpx.post(url + "/v1/completions", json=body, timeout=60).json()
        assert got["choices"][0]["text"] == want[0].outputs[0].text
        assert "tensor parallel over 2 ranks" in log.read_text()
        ranks = _children(proc.pid)
        assert len(ranks) == 2, ranks  # torchrun's agent started both; neither started more
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    finally:
        if proc.poll() is None:
            proc.kill()
    deadline = time.monotonic() + 10
    while any(_alive(pid) for pid in ranks) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not any(_alive(pid) for pid in ranks), log.read_text()
    assert "rank 1 failed" not in log.read_text()
