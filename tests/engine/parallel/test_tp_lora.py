"""Tensor parallel with a LoRA adapter: TP=2 over gloo computes what one process computes
(float32 logits within 1e-5, the tolerance of test_tp_logits.py) on the PyTorch layers and on
the C++ step, with an adapter on all seven projections (each cut as its base projection is:
models/lora/shard.py) serving one sequence while the other runs on the base model in the same
steps. Rank 0 loads the adapter as the engine does (`runner.load_adapter`), so rank 1 gets it
through the step channel. Not vacuous: the adapter's rows differ from the base model's.
Through the engine (`tensor_parallel_size=2`, the rank a server's process): greedy tokens of
requests under the adapter and of the base, in one batch, equal one process's."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
import torch.multiprocessing as mp

from engine import Engine, EngineConfig, SamplingParams
from engine.lora_config import LoraConfig
from engine.runner_factory import build_runner
from models.parallel import exit_rank, free_port, init_group
from tests.checkpoints import make_hf_model, save_checkpoint
from tests.engine.engine_fixtures import random_prompts
from tests.engine.parallel.tp_driver import _config, _script
from tests.models.lora.peft_adapters import make_peft_adapter

pytestmark = pytest.mark.cpu_kernels

PATHS = (False, True)  # the PyTorch layers, the C++ step


def _script_run(runner, slot: int) -> list[torch.Tensor]:
    """The driver's script with its first sequence (tokens 3..) under `slot`, the other base."""
    out = []
    for chunks, copies, full in _script():
        tagged = [
            dataclasses.replace(
                c, request=SimpleNamespace(lora_slot=slot if c.seq.token_ids[0] == 3 else -1)
            )
            for c in chunks
        ]
        logits = runner.forward(tagged, copies, full)
        out.append(logits.sampling.clone())
        out.extend(logits.all_rows[i].clone() for i in sorted(logits.all_rows))
    return out


def _with_adapter(adapter: Path, cpu_kernels: bool, world: int) -> EngineConfig:
    lora = LoraConfig(adapters=(("ad", str(adapter)),))
    return dataclasses.replace(_config("float32", cpu_kernels, world), lora=lora)


def _runner(base: Path, adapter: Path, cpu_kernels: bool, world: int, group=None):
    return build_runner(base, _with_adapter(adapter, cpu_kernels, world), False, group).runner


def _rank(rank: int, port: int, base: str, adapter: str, out) -> None:
    torch.set_num_threads(1)
    group = init_group(rank, 2, port, torch.device("cpu"))
    for cpu_kernels in PATHS:
        runner = _runner(Path(base), Path(adapter), cpu_kernels, 2, group)
        channel = runner.parallel.channel
        if rank == 0:
            runner.load_adapter(0, "ad", adapter)  # rank 1 loads it from the channel
            logits = _script_run(runner, 0)
            channel.send_stop()
            out.put([t.numpy() for t in logits])
        else:
            while (step := channel.receive()) is not None:
                runner.run(step)
    group.close()
    exit_rank(0)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tp_lora")
    base = save_checkpoint("llama", root / "base")
    make_peft_adapter(make_hf_model("llama"), root / "ad", seed=7)
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    args = (port, str(base), str(root / "ad"), out)
    procs = [ctx.Process(target=_rank, args=(r, *args)) for r in range(2)]
    for p in procs:
        p.start()
    tp2 = [[torch.from_numpy(x) for x in out.get()] for _ in PATHS]
    for p in procs:
        p.join(60)
        assert p.exitcode == 0, f"rank exited with {p.exitcode}"
    results: dict = {"root": root}
    for cpu_kernels, got in zip(PATHS, tp2, strict=True):
        runner = _runner(base, root / "ad", cpu_kernels, 1)
        runner.load_adapter(0, "ad", str(root / "ad"))
        results[cpu_kernels] = (_script_run(runner, 0), got, _script_run(runner, -1))
    return results


@pytest.mark.parametrize("cpu_kernels", PATHS, ids=["pytorch", "cpp_step"])
def test_tp2_with_an_adapter_equals_tp1(runs, cpu_kernels: bool) -> None:
    want, got, base = runs[cpu_kernels]
    assert len(want) == len(got)
    for w, g in zip(want, got, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=0)
    moved = [not torch.allclose(w, b, atol=1e-3) for w, b in zip(want, base, strict=True)]
    assert sum(moved) >= len(moved) // 2  # the adapter's rows (not vacuous)


def test_engine_tp2_greedy_tokens_with_an_adapter_equal_one_process(runs) -> None:
    root = runs["root"]
    prompts = random_prompts(3, (5, 12), seed=3)
    params = [
        SamplingParams(max_tokens=8, temperature=0, ignore_eos=True, adapter=name)
        for name in ("ad", None, "ad")
    ]

    def tokens(tp: int) -> list[tuple[int, ...]]:
        config = _with_adapter(root / "ad", cpu_kernels=True, world=tp)
        engine = Engine.from_model(str(root / "base"), config)
        try:
            return [o.outputs[0].token_ids for o in engine.generate(prompts, params)]
        finally:
            engine.close()

    want = tokens(1)
    assert tokens(2) == want
