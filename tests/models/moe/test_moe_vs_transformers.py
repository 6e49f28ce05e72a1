"""Mixtral, Qwen3-MoE (with a dense layer) and Qwen2-MoE (shared expert, qkv bias) equal
transformers through the paged KV cache: a batched prefill of prompts of different lengths,
then batched decode steps, in float32 (1e-4) and bfloat16; and weights load both as the files
store experts (one tensor per expert) and as transformers' state_dict groups them."""

from __future__ import annotations

import pytest
import torch

from models import build_model
from models.config import ModelConfig
from tests.checkpoints import MOE_ARCHITECTURES, VOCAB, make_hf_model
from tests.models.paged_driver import PagedDriver
from tests.models.test_models_vs_transformers import hf_logits


def ours_from(hf, dtype: torch.dtype, device, from_files: bool) -> torch.nn.Module:
    config = ModelConfig.from_hf_dict(hf.config.to_dict())
    model = build_model(config, dtype, device)
    if from_files:  # the names save_pretrained writes: one tensor per expert and projection
        import tempfile

        from safetensors.torch import load_file

        with tempfile.TemporaryDirectory() as folder:
            hf.save_pretrained(folder)
            tensors = load_file(f"{folder}/model.safetensors")
        model.load_weights(tensors.items())
    else:
        model.load_weights(hf.state_dict().items())
    return model


def run_prefill_then_decode(ours, hf_ref, decode_steps: int):
    """Yields (our logits, the reference's logits [n, V] float32) for a batched prefill of
    three prompts, then for each batched greedy decode step (our argmax fed back)."""
    driver = PagedDriver(ours, block_size=4)
    gen = torch.Generator().manual_seed(1)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (5, 11, 18)]
    seqs = [driver.add_sequence() for _ in prompts]
    logits = driver.step(dict(zip(seqs, prompts, strict=True)))
    for seq, prompt in zip(seqs, prompts, strict=True):
        yield logits[seq].float(), hf_ref(prompt)
    tokens = [list(p) for p in prompts]
    for _ in range(decode_steps):
        nxt = {s: [int(logits[s][-1].argmax())] for s in seqs}
        logits = driver.step(nxt)
        for s in seqs:
            tokens[s] += nxt[s]
            yield logits[s][-1:].float(), hf_ref(tokens[s])[-1:]


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_float32_logits_equal_transformers(arch, device) -> None:
    hf = make_hf_model(arch).to(device)
    ours = ours_from(hf, torch.float32, device, from_files=True)
    for got, want in run_prefill_then_decode(ours, lambda t: hf_logits(hf, t), 5):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_bfloat16_logits_as_close_to_float32_as_transformers_bfloat16(arch, device) -> None:
    """Both round every op to bfloat16, in other orders (transformers sums the experts in
    bfloat16 by expert id, we in float32 by rank), so neither equals the other: on the same
    tokens ours must stay as close to the float32 logits as transformers' bfloat16 model
    (within 2x), and pick the same greedy tokens wherever float32's top two are not close."""
    hf32 = make_hf_model(arch).to(device)
    hf16 = make_hf_model(arch).to(device=device, dtype=torch.bfloat16)
    ours = ours_from(hf16, torch.bfloat16, device, from_files=False)
    assert_bfloat16_as_close_as_transformers(ours, hf32, hf16)


def assert_bfloat16_as_close_as_transformers(ours, hf32, hf16) -> None:
    """Our bfloat16 model's logits, prefill then 2 decode steps, are within 2x of
    transformers' bfloat16 error against its float32 model, with float32's greedy tokens
    wherever its top two are further apart than that."""
    hf16_error = []

    def reference(tokens: list[int]) -> torch.Tensor:
        want = hf_logits(hf32, tokens)
        hf16_error.append(float((hf_logits(hf16, tokens) - want).abs().max()))
        return want

    worst = 0.0
    for got, want in run_prefill_then_decode(ours, reference, 2):
        worst = max(worst, float((got - want).abs().max()))
        top2 = want.topk(2, dim=-1).values
        clear = (top2[:, 0] - top2[:, 1]) > 2 * max(hf16_error)
        assert torch.equal(got.argmax(-1)[clear], want.argmax(-1)[clear])
    assert worst <= 2 * max(hf16_error)
