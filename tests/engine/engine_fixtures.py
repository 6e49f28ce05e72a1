"""Engines on tiny seeded checkpoints (token-id prompts: the folders carry no tokenizer)."""

from __future__ import annotations

from pathlib import Path

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.outputs import OutputAccumulator
from engine.requests.sampling_params import SamplingParams
from tests.checkpoints import VOCAB, save_checkpoint
from tests.devices import selected_device


def tiny_engine(folder: Path, arch: str = "llama", **config) -> Engine:
    """On the tests' device (TGSERVE_TEST_DEVICE, default cpu) unless `device=` is given."""
    if folder.suffix != ".gguf" and not (folder / "config.json").exists():
        save_checkpoint(arch, folder)
    defaults = dict(
        dtype="float32",
        kv_cache_memory_bytes=4_000_000,
        block_size=4,
        max_num_seqs=16,
        device=str(selected_device()),
    )
    return Engine.from_model(str(folder), EngineConfig(**{**defaults, **config}))


def random_prompts(n: int, lengths: tuple[int, int], seed: int = 0) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.randint(lengths[0], lengths[1] + 1, (n,), generator=gen).tolist()
    return [torch.randint(3, VOCAB, (s,), generator=gen).tolist() for s in sizes]


def run_staggered(engine: Engine, prompts, params: list[SamplingParams], arrive_every: int = 1):
    """Adds request i at step i * arrive_every; returns {index: whole final RequestOutput}."""
    finals, step, next_i = {}, 0, 0
    partial: dict[int, OutputAccumulator] = {}
    while next_i < len(prompts) or engine.has_unfinished_requests():
        while next_i < len(prompts) and step >= next_i * arrive_every:
            engine.add_request(str(next_i), prompts[next_i], params[next_i])
            next_i += 1
        for out in engine.step():
            acc = partial.setdefault(int(out.request_id), OutputAccumulator())
            acc.add(out)
            if out.finished:
                finals[int(out.request_id)] = acc.result()
        step += 1
    return finals


def assert_no_leaks(engine: Engine) -> None:
    stats = engine.stats()
    assert stats.num_running == 0 and stats.num_waiting == 0
    assert stats.kv_blocks_used == 0, f"{stats.kv_blocks_used} KV blocks still held"
    engine.scheduler.block_manager.check_invariants()
    assert not engine.has_unfinished_requests()


def run_beside_a_long_request(
    folder: Path, request_id: str, prompt, params: SamplingParams, seed: int
):
    """Runs `request_id` in a cache too small for it beside a 120-token greedy request admitted
    first, so the group is preempted. Returns (its final output, its preemption count, engine).

    Tiny llama: 2 layers, 2 KV heads, head_dim 16, fp32, block 4 -> 2 KiB per block. 46 blocks
    hold a 4-wide group's worst case (4 x 11) but not beside the other request's 45."""
    other = random_prompts(1, (120, 120), seed=seed)[0]
    engine = tiny_engine(folder, kv_cache_memory_bytes=46 * 2048, max_num_batched_tokens=128)
    engine.add_request(
        "other", other, SamplingParams(max_tokens=60, temperature=0.0, ignore_eos=True)
    )
    engine.add_request(request_id, prompt, params)  # admitted last: the one preempted
    preemptions, final, acc = 0, None, OutputAccumulator()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.request_id == request_id:
                acc.add(out)
                final = acc.result() if out.finished else final
        request = engine.get_request(request_id)
        preemptions = request.num_preemptions if request is not None else preemptions
    return final, preemptions, engine
