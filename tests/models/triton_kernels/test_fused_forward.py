"""The fused Triton kernels wired into the model (models/layers.py, models/triton_kernels
`enabled`): forcing them on CPU (through Triton's interpreter) gives a tiny Llama's logits
within float32 tolerance of the PyTorch path, over a prefill and decode steps, and every fused
kernel ran. The PyTorch path itself is what test_models_vs_transformers.py checks against
transformers; CPU runs never take the kernels unless forced."""

from __future__ import annotations

import pytest
import torch

import models.triton_kernels as kernels_switch
from models.triton_kernels import rms_norm, rotary, silu_mul
from tests.checkpoints import VOCAB, make_hf_model
from tests.models.paged_driver import PagedDriver
from tests.models.test_models_vs_transformers import ours_from

TOL = 1e-4  # float32: the kernels round once where torch rounds per op


def _run(model, prompts: list[list[int]], decode_steps: int) -> list[torch.Tensor]:
    """Every step's logits: a batched prefill, then greedy decode steps of all sequences."""
    driver = PagedDriver(model, block_size=4)
    seqs = [driver.add_sequence() for _ in prompts]
    logits = driver.step(dict(zip(seqs, prompts, strict=True)))
    out = [logits[s] for s in seqs]
    for _ in range(decode_steps):
        logits = driver.step({s: [int(logits[s][-1].argmax())] for s in seqs})
        out += [logits[s] for s in seqs]
    return out


@pytest.mark.parametrize("arch", ["llama3", "qwen3"])
def test_forced_kernels_match_the_pytorch_forward(triton_kernels, arch, monkeypatch) -> None:
    if triton_kernels.type != "cpu":
        pytest.skip("forcing is for CPU runs; on a GPU the engine tests take the kernels")
    model = ours_from(make_hf_model(arch))
    gen = torch.Generator().manual_seed(4)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (3, 9)]
    with torch.no_grad():
        want = _run(model, prompts, decode_steps=3)
        calls = {"rms_norm": 0, "rotary": 0, "silu_mul": 0}
        for module in (rms_norm, rotary, silu_mul):
            monkeypatch.setattr(module, module.__name__.rsplit(".")[-1], _counted(module, calls))
        monkeypatch.setattr(kernels_switch, "enabled", lambda x: True)
        got = _run(model, prompts, decode_steps=3)
    assert all(count > 0 for count in calls.values()), calls
    for step, (g, w) in enumerate(zip(got, want, strict=True)):
        torch.testing.assert_close(g, w, atol=TOL, rtol=0, msg=f"logits {step}")


def _counted(module, calls: dict[str, int]):
    name = module.__name__.rsplit(".")[-1]
    kernel = getattr(module, name)

    def wrapper(*args, **kwargs):
        calls[name] += 1
        return kernel(*args, **kwargs)

    return wrapper


def test_forced_kernels_and_invariant_matmul_keep_a_sequence_off_the_batch(
    triton_kernels, monkeypatch
) -> None:
    """The --batch-invariant mode on CPU: every linear routed through the Triton invariant GEMM
    by the forward path's own switch (what `_triton_cuda` does with batch_invariant), the fused
    kernels forced; each sequence's logits in a batch of three equal, bitwise, its logits run
    alone (prefill, then decode steps)."""
    if triton_kernels.type != "cpu":
        pytest.skip("forcing is for CPU runs")
    from models.forward_path import route_linears_through_invariant_gemm

    model = ours_from(make_hf_model("llama3"))
    linears = sum(isinstance(m, torch.nn.Linear) for m in model.modules())
    assert route_linears_through_invariant_gemm(model) == linears > 0  # LM head included
    monkeypatch.setattr(kernels_switch, "enabled", lambda x: True)
    gen = torch.Generator().manual_seed(6)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (2, 7, 5)]
    with torch.no_grad():
        batched = _run(model, prompts, decode_steps=2)  # per step: one entry per sequence
        for i, prompt in enumerate(prompts):
            alone = _run(model, [prompt], decode_steps=2)
            for step, logits in enumerate(alone):
                assert torch.equal(batched[step * len(prompts) + i], logits), (i, step)
