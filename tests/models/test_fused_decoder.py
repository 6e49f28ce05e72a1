"""The C++ forward step (models/cpu_kernels/fused_decoder.py: prefill chunks and decodes) against
two oracles: transformers' logits on tiny random checkpoints (float32, 1e-4), and our eager
PyTorch path in bfloat16 (same block layout, same tokens: logits and the K/V written to the
cache agree to bf16 rounding). Batch invariance of the step is in tests/models/test_cpu_kernel_invariance.py.

The extension is compiled on first use (~1 minute cold, cached afterwards)."""

from __future__ import annotations

import pytest
import torch

from models import build_model
from models.attention import AttentionMetadata
from models.config import ModelConfig
from models.cpu_kernels.fused_decoder import FusedDecoder
from models.quantization import quantize_int8_weight_only
from tests.checkpoints import VOCAB, make_hf_model
from tests.models.paged_driver import PagedDriver
from tests.models.test_models_vs_transformers import hf_logits

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)


def ours_from(hf_model, dtype: torch.dtype) -> torch.nn.Module:
    config = ModelConfig.from_hf_dict(hf_model.config.to_dict())
    model = build_model(config, dtype, "cpu")
    model.load_weights(hf_model.state_dict().items())
    return model


def prompts(lengths: tuple[int, ...], seed: int = 1) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("arch", ["llama", "llama3", "qwen2", "qwen3", "mistral"])
def test_fused_steps_equal_transformers(arch: str) -> None:
    hf = make_hf_model(arch)
    ours = ours_from(hf, torch.float32)
    driver = PagedDriver(ours, block_size=4)
    fused = FusedDecoder.build(ours, driver.kv)
    assert fused is not None
    tokens = prompts((5, 11, 18, 13))  # 18 > the mistral window of 8
    seqs = [driver.add_sequence() for _ in tokens]
    # Prefill of three prompts, then a mixed step: decodes of those beside the 4th prompt
    # arriving in two chunks; every step through the fused path.
    logits = driver.step(dict(zip(seqs[:3], tokens[:3], strict=True)), fused=fused)
    for s in seqs[:3]:
        torch.testing.assert_close(logits[s], hf_logits(hf, tokens[s]), atol=1e-4, rtol=0)
    late = seqs[3]
    for chunk in (tokens[late][:6], tokens[late][6:]):
        nxt = {s: [int(logits[s][-1].argmax())] for s in seqs[:3]}
        logits = driver.step({**nxt, late: chunk}, fused=fused)
        for s in seqs[:3]:
            tokens[s] += nxt[s]
            torch.testing.assert_close(
                logits[s][-1], hf_logits(hf, tokens[s])[-1], atol=1e-4, rtol=0
            )
    torch.testing.assert_close(logits[late], hf_logits(hf, tokens[late])[6:], atol=1e-4, rtol=0)
    for _ in range(8):
        nxt = {s: [int(logits[s][-1].argmax())] for s in seqs}
        logits = driver.step(nxt, fused=fused)
        for s in seqs:
            tokens[s] += nxt[s]
            torch.testing.assert_close(
                logits[s][-1], hf_logits(hf, tokens[s])[-1], atol=1e-4, rtol=0
            )


@pytest.mark.parametrize("arch", ["llama", "qwen2", "qwen3", "mistral"])
def test_fused_bfloat16_matches_the_eager_path(arch: str) -> None:
    hf = make_hf_model(arch)
    ours = ours_from(hf, torch.bfloat16)
    eager, fast = PagedDriver(ours, block_size=4), PagedDriver(ours, block_size=4)
    fused = FusedDecoder.build(ours, fast.kv)
    assert fused is not None
    tokens = prompts((3, 9, 14, 20, 7))
    for driver in (eager, fast):
        seqs = [driver.add_sequence() for _ in tokens]
        driver.step(dict(zip(seqs, tokens, strict=True)), fused=fused if driver is fast else None)
    gen = torch.Generator().manual_seed(2)
    for _ in range(10):
        nxt = {
            s: [int(t)] for s, t in enumerate(torch.randint(3, VOCAB, (len(seqs),), generator=gen))
        }
        want, got = eager.step(nxt), fast.step(nxt, fused=fused)
        for s in seqs:
            # Logits of this random model are ~0.5 in size: bf16 rounding of the hidden
            # states (eps 2^-8) moves them by a few 1e-3.
            torch.testing.assert_close(got[s], want[s], atol=2e-2, rtol=2e-2)
    for (k_want, v_want), (k_got, v_got) in zip(eager.kv, fast.kv, strict=True):
        torch.testing.assert_close(k_got.float(), k_want.float(), atol=3e-2, rtol=3e-2)
        torch.testing.assert_close(v_got.float(), v_want.float(), atol=3e-2, rtol=3e-2)


@pytest.mark.parametrize("arch", ["llama", "qwen2"])
def test_fused_int8_matches_the_eager_int8_path(arch: str) -> None:
    """Weight-only int8 with bfloat16 activations runs in the C++ step (int8 panels widened
    to bf16 in registers) and agrees with the eager Int8Linear path to bf16 rounding."""
    ours = quantize_int8_weight_only(ours_from(make_hf_model(arch), torch.bfloat16))
    eager, fast = PagedDriver(ours, block_size=4), PagedDriver(ours, block_size=4)
    fused = FusedDecoder.build(ours, fast.kv)
    assert fused is not None
    tokens = prompts((3, 9, 14))
    for driver in (eager, fast):
        seqs = [driver.add_sequence() for _ in tokens]
        want = driver.step(
            dict(zip(seqs, tokens, strict=True)), fused=fused if driver is fast else None
        )
        if driver is eager:
            reference = want
    for s in seqs:
        torch.testing.assert_close(want[s], reference[s], atol=2e-2, rtol=2e-2)


def test_models_it_does_not_run_keep_their_path() -> None:
    gpt2 = ours_from(make_hf_model("gpt2"), torch.float32)
    assert FusedDecoder.build(gpt2, PagedDriver(gpt2).kv) is None
    llama = ours_from(make_hf_model("llama"), torch.float32)
    quantize_int8_weight_only(llama)
    assert FusedDecoder.build(llama, PagedDriver(llama).kv) is None


def test_a_token_count_that_disagrees_with_the_metadata_is_refused() -> None:
    ours = ours_from(make_hf_model("llama"), torch.float32)
    fused = FusedDecoder.build(ours, PagedDriver(ours).kv)
    meta = AttentionMetadata.build([[0]], [3], [3], block_size=4)
    with pytest.raises(ValueError, match="3 new tokens"):
        fused.hidden(torch.tensor([5, 6]), torch.tensor([0, 1]), meta)


def test_the_cpp_decoder_takes_a_layers_weights_by_name() -> None:
    from models import cpu_kernels

    ext = cpu_kernels.extension()
    weight = torch.ones(4, 4)
    with pytest.raises(TypeError):
        ext.LinearWeights(weight)  # keyword-only: no tensor is matched by its position
    linear = ext.LinearWeights(weight=weight, packed=ext.pack_linear(weight))
    assert linear.weight is not None and linear.packed is not None and linear.bias is None
