"""bench.attention_keys' clocks: `--clock thread` times one thread's CPU time and is refused
when the process runs more threads (the kernel's OpenMP team would then run on threads the
clock does not see); each context length prints its decode and prefill figures, the prefill's
fastest call never above its median."""

from __future__ import annotations

import re

import pytest
import torch

from bench import attention_keys, machine_limits


def test_the_thread_clock_is_refused_beside_other_threads(monkeypatch):
    monkeypatch.setattr(torch, "get_num_threads", lambda: 2)
    with pytest.raises(SystemExit, match="OMP_NUM_THREADS=1"):
        attention_keys.main(["--lens", "16", "--chunk", "4", "--rounds", "1", "--clock", "thread"])


def test_one_thread_prints_every_length_on_the_thread_clock(capsys, monkeypatch):
    # the 1 GiB read probe takes seconds; its figure only scales the decode column
    monkeypatch.setattr(machine_limits, "probe_read_gb_s", lambda: (10.0,))
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        attention_keys.main(
            [
                "--model",
                "random:llama3-8b",
                "--lens",
                "16,40",
                "--chunk",
                "8",
                "--rounds",
                "3",
                "--clock",
                "thread",
            ]
        )
    finally:
        torch.set_num_threads(threads)
    out = capsys.readouterr().out
    assert "1 threads, thread clock" in out
    rows = re.findall(
        r"L=\s*(\d+): .* prefill (\d+) rows\s+([\d.]+) ns/\(row, key\) \(fastest\s+([\d.]+)\)", out
    )
    assert [(int(n), int(r)) for n, r, _, _ in rows] == [(16, 8), (40, 8)]
    for _, _, median, fastest in rows:
        assert 0 < float(fastest) <= float(median)
