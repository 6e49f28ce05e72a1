"""Per-stage step time of pipeline parallel on this machine (PERFORMANCE.md), not a test:
`python -m tests.engine.parallel.pp_timing [stages]`.

A random Llama of hidden 512, 8 layers (float32) runs one prefill step (4 prompts of 64
tokens) and 20 decode steps of the 4 sequences, at 1 stage (in this process) and at
`stages` stages (spawned gloo ranks, one thread each). Each stage's busy time per step is
the sum of its micro-batches' layer time (the runner's `trace` hook; the prefill is the
first two micro-batches); the step's wall time is
rank 0's; each run is timed after one untimed pass of the same steps. One process runs twice: on the C++ step and on the stages' own path (PyTorch
layers with the C++ attention). Prints milliseconds per step and the bytes sent between stages per step.
"""

from __future__ import annotations

import contextlib
import sys
import time
from functools import partial
from pathlib import Path
from tempfile import TemporaryDirectory

import torch
import torch.multiprocessing as mp

from engine.config import EngineConfig
from engine.runner_factory import build_runner
from engine.scheduling.step_plan import ScheduledChunk
from models import forward_path
from models.parallel import exit_rank, free_port, init_group
from tests.checkpoints import save_checkpoint
from tests.engine.parallel.tp_driver import _Seq

SHAPE = dict(hidden_size=512, intermediate_size=1408, num_hidden_layers=8, vocab_size=4096)
SHAPE |= dict(num_attention_heads=8, num_key_value_heads=2)
PROMPT, SEQS, DECODES, BLOCK = 64, 4, 20, 16
_Chunk = partial(ScheduledChunk, None)


def _steps():
    seqs = [_Seq(list(range(3 + i, 3 + i + PROMPT))) for i in range(SEQS)]
    per_seq = (PROMPT + DECODES) // BLOCK + 2
    for i, seq in enumerate(seqs):
        seq.block_table = list(range(i * per_seq, (i + 1) * per_seq))
    yield "prefill", [_Chunk(s, 0, PROMPT, True) for s in seqs]
    for t in range(DECODES):
        for s in seqs:
            s.token_ids.append(100 + t)
        yield "decode", [_Chunk(s, len(s.token_ids) - 1, 1, True) for s in seqs]


def _config(stages: int) -> EngineConfig:
    return EngineConfig(
        dtype="float32", device="cpu", block_size=BLOCK, cpu_kernels=True,
        kv_cache_memory_bytes=1 << 26, max_num_seqs=SEQS, max_num_batched_tokens=PROMPT * SEQS,
        pipeline_parallel_size=stages,
    )  # fmt: skip


def _timed(runner, warm_up: bool = False) -> dict[str, list[float]]:
    walls: dict[str, list[float]] = {"prefill": [], "decode": []}
    if warm_up:
        _timed(runner, warm_up=False)
    for kind, chunks in _steps():
        t0 = time.monotonic()
        runner.forward(chunks)
        walls[kind].append(time.monotonic() - t0)
    return walls


class _Busy:
    def __init__(self, ctx) -> None:
        self.events = ctx.SimpleQueue()

    def __call__(self, stage: int, micro_batch: int, event: str) -> None:
        self.events.put((stage, event, time.monotonic()))


@contextlib.contextmanager
def _layers_path():
    """PyTorch layers with the C++ paged attention (what a pipeline stage runs) on one process."""
    saved = forward_path.BACKENDS_BY_DEVICE["cpu"]
    forward_path.BACKENDS_BY_DEVICE["cpu"] = ("pytorch_cpu",)
    try:
        yield
    finally:
        forward_path.BACKENDS_BY_DEVICE["cpu"] = saved


def _rank(rank: int, stages: int, port: int, path: str, hook, out) -> None:
    torch.set_num_threads(1)
    group = init_group(rank, stages, port, torch.device("cpu"))
    runner = build_runner(Path(path), _config(stages), False, group).runner
    runner.trace = hook
    if rank == 0:
        _timed(runner)  # warm-up: first calls, allocations
        hook.events.put((-1, "reset", 0.0))  # after every stage's warm-up events
        out.put(_timed(runner))
        runner.parallel.channel.send_stop()
    else:
        while (step := runner.parallel.channel.receive()) is not None:
            runner.run(step)
    group.close()
    exit_rank(0)


def main(stages: int = 2) -> None:
    torch.set_num_threads(1)
    with TemporaryDirectory() as tmp:
        path = save_checkpoint("llama", Path(tmp) / "m", **SHAPE)
        solo = {"C++ step": _timed(build_runner(path, _config(1), False).runner, warm_up=True)}
        # The stages' own path (the C++ step runs whole models only), for a like-for-like peer.
        with _layers_path():
            solo["layers"] = _timed(build_runner(path, _config(1), False).runner, warm_up=True)
        ctx = mp.get_context("spawn")
        out, hook, port = ctx.SimpleQueue(), _Busy(ctx), free_port()
        procs = [
            ctx.Process(target=_rank, args=(r, stages, port, str(path), hook, out))
            for r in range(stages)
        ]
        for p in procs:
            p.start()
        walls = out.get()
        for p in procs:
            p.join(60)
    busy = [[0.0, 0.0] for _ in range(stages)]  # per stage: [prefill, decode] seconds
    started: dict[int, float] = {}
    ended: dict[int, int] = {}  # micro-batches a stage finished (the first two: the prefill)
    while not hook.events.empty():
        stage, event, at = hook.events.get()
        if event == "reset":
            busy, ended = [[0.0, 0.0] for _ in range(stages)], {}
        elif event == "start":
            started[stage] = at
        else:
            ended[stage] = ended.get(stage, 0) + 1
            busy[stage][ended[stage] > 2] += at - started[stage]
    steps = 1 + DECODES
    hidden = SHAPE["hidden_size"]
    sent = (PROMPT * SEQS + DECODES * SEQS) * hidden * 4  # forward hidden states, float32
    back = steps * SEQS * hidden * 4  # the sampled rows' final hidden states
    for name, runs in (*(("one process, " + k, v) for k, v in solo.items()), ("stages", walls)):
        ms = {k: 1000 * sum(v) / len(v) for k, v in runs.items()}
        print(f"{name}: prefill {ms['prefill']:.1f} ms, decode {ms['decode']:.2f} ms per step")
    for stage, (prefill, decode) in enumerate(busy):
        print(
            f"stage {stage} busy: prefill {1000 * prefill:.1f} ms, decode {1000 * decode / DECODES:.2f} ms/step"
        )
    print(f"bytes between stages over {steps} steps: {sent} forward, {back} back")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:]))
