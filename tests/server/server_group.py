"""What the tests of servers spread over processes (network namespaces) share.

`solo_texts(folder, prompts, max_tokens, seeded, **config)` is their oracle: each prompt on an
engine built in this process (float32 on the CPU, block size 4, plus `config`), as
`{"greedy": [...], "seeded": [...]}`: what a group of processes or servers must answer.
`wait_ready(client, proc, log)` polls the serving process's /ready (240 s at most: a cold
build of the C++ kernels takes ~1 min), failing with its log if it exits first.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import httpx

from engine import Engine, EngineConfig, SamplingParams


def solo_texts(
    folder: Path, prompts: list[str], max_tokens: int, seeded: dict[str, Any], **config: Any
) -> dict[str, list[str]]:
    config = EngineConfig(dtype="float32", device="cpu", block_size=4, **config)
    engine = Engine.from_model(str(folder), config)
    greedy = SamplingParams(max_tokens=max_tokens, temperature=0.0)
    sampled = SamplingParams(max_tokens=max_tokens, **seeded)
    return {
        "greedy": [o.outputs[0].text for o in engine.generate(prompts, greedy)],
        "seeded": [o.outputs[0].text for o in engine.generate(prompts, sampled)],
    }


def wait_ready(client: httpx.Client, proc, log: Path) -> None:
    deadline = time.monotonic() + 240
    while True:
        assert proc.poll() is None, log.read_text()
        assert time.monotonic() < deadline, "the server did not become ready"
        try:
            if client.get("/ready").status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
