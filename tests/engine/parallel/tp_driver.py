"""Runs the same scripted steps through a model runner at TP=1 (in this process) and at TP=N
(N spawned processes on gloo; or N x P under pipeline parallel), returning rank 0's logits,
for tests that compare them.

The script: two prompts prefilled in one step (one chunked over two steps), then decodes of
both, a copy-on-write block copy, and a step asking for every row's logits (prompt logprobs).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
import torch.multiprocessing as mp

from engine.config import EngineConfig
from engine.runner_factory import build_runner
from engine.scheduling.step_plan import ScheduledChunk
from models.parallel import exit_rank, free_port, init_group


@dataclass
class _Seq:
    token_ids: list[int]
    block_table: list[int] = field(default_factory=list)


# The scheduler's chunk of a bare sequence, without a request: _Chunk(seq, start, n, sample).
_Chunk = partial(ScheduledChunk, None)


def _script() -> list[tuple[list[_Chunk], list[tuple[int, int]], frozenset[int]]]:
    a = _Seq(list(range(3, 20)), [5, 2, 9, 7, 11, 13])  # 17 tokens (+5), blocks of 4
    b = _Seq([40, 41, 42, 43, 44, 45], [1, 3, 8])
    steps = [([_Chunk(a, 0, 10, False), _Chunk(b, 0, 6, True)], [], frozenset({1}))]
    steps.append(([_Chunk(a, 10, 7, True), _Chunk(b, 6, 1, True)], [], frozenset()))
    b.token_ids.append(46)
    for token in range(50, 55):
        a.token_ids.append(token)
        b.token_ids.append(token + 100)
        steps.append(
            (
                [
                    _Chunk(a, len(a.token_ids) - 1, 1, True),
                    _Chunk(b, len(b.token_ids) - 1, 1, True),
                ],
                [],
                frozenset(),
            )
        )
    # A fork of b's first 10 tokens gets a copy of b's half-filled third block and decodes.
    fork = _Seq(b.token_ids[:10] + [60], [1, 3, 12])
    steps.append(([_Chunk(fork, 10, 1, True)], [(8, 12)], frozenset({0})))
    return steps


def _run_script(runner) -> list[torch.Tensor]:
    out = []
    for chunks, copies, full in _script():
        logits = runner.forward(chunks, copies, full)
        out.append(logits.sampling.clone())
        out.extend(logits.all_rows[i].clone() for i in sorted(logits.all_rows))
    return out


def _config(
    dtype: str, cpu_kernels: bool, world: int, stages: int = 1, kv_cache_dtype: str = "auto"
) -> EngineConfig:
    return EngineConfig(
        dtype=dtype,
        device="cpu",
        block_size=4,
        cpu_kernels=cpu_kernels,
        kv_cache_memory_bytes=1 << 22,
        max_num_seqs=4,
        max_num_batched_tokens=64,
        tensor_parallel_size=world,
        pipeline_parallel_size=stages,
        kv_cache_dtype=kv_cache_dtype,
    )


def run_tp1(path: Path, dtype: str, cpu_kernels: bool, *kv: str) -> list[torch.Tensor]:
    runner = build_runner(path, _config(dtype, cpu_kernels, 1, 1, *kv), False).runner
    return _run_script(runner)


# (checkpoint folder, dtype, C++ kernels[, KV cache dtype]: "auto" when not given)
Case = tuple[str, str, bool] | tuple[str, str, bool, str]


def _rank(rank: int, world: int, port: int, cases: list[Case], out, stages: int, hook) -> None:
    torch.set_num_threads(1)
    group = init_group(rank, world * stages, port, torch.device("cpu"))
    for path, dtype, cpu_kernels, *kv in cases:  # one group, one runner per case, in turn
        config = _config(dtype, cpu_kernels, world, stages, *kv)
        runner = build_runner(Path(path), config, False, group).runner
        if hook is not None:
            runner.trace = hook
        channel = runner.parallel.channel
        if rank == 0:
            logits = _run_script(runner)
            channel.send_stop()
            out.put(([t.numpy() for t in logits], runner.forward_path.description))
        else:
            while (step := channel.receive()) is not None:
                runner.run(step)
    group.close()
    exit_rank(0)  # as a server's ranks end (engine/parallel/worker_main.py)


def run_tp(
    cases: list[Case], world: int = 2, stages: int = 1, hook=None
) -> list[tuple[list[torch.Tensor], str]]:
    """Per case: rank 0's logits of the script and its forward path's description. The
    ranks (`world` tensor-parallel ranks in each of `stages` pipeline stages) are spawned once
    for all the cases (starting processes is the slow part). `hook`: a picklable callable set
    as every pipeline stage's `trace` (engine/parallel/pipeline_runner.py)."""
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    cases = [(str(p), *rest) for p, *rest in cases]
    procs = [
        ctx.Process(target=_rank, args=(r, world, port, cases, out, stages, hook))
        for r in range(world * stages)
    ]
    for p in procs:
        p.start()
    results = []
    for _ in cases:
        logits, description = out.get()
        results.append(([torch.from_numpy(x) for x in logits], description))
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    return results
