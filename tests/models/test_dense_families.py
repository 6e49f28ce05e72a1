"""Gemma 2, Gemma 3 and Phi-3 (with and without LongRoPE) equal transformers through the paged
KV cache: a batched prefill of prompts of different lengths (longer than the sliding window),
then batched decode steps that cross the window and LongRoPE's original length, each logit
row against transformers' own incremental forward (prefill, then one token at a time over its
cache: what its generate does). float32 to 1e-4; bfloat16 against transformers in bfloat16."""

from __future__ import annotations

import pytest
import torch

from models import build_model
from models.config import ModelConfig
from models.pointwise import softcap
from tests.checkpoints import VOCAB
from tests.family_checkpoints import (
    FAMILIES,
    LONGROPE_ORIGINAL,
    WINDOW,
    hf_incremental,
    make_family_model,
)
from tests.models.paged_driver import PagedDriver


def ours_from(hf_model, dtype: torch.dtype, device="cpu") -> torch.nn.Module:
    model = build_model(ModelConfig.from_hf_dict(hf_model.config.to_dict()), dtype, device)
    model.load_weights(hf_model.state_dict().items())
    return model


def run_ours(model, prompts: list[list[int]], steps: int) -> tuple[list, list[list[int]]]:
    """Our logits per sequence ([prompt rows], then one row per decode) and greedy tokens."""
    driver = PagedDriver(model, block_size=4)
    seqs = [driver.add_sequence() for _ in prompts]
    out = driver.step(dict(zip(seqs, prompts, strict=True)))
    rows = [[out[s].float()] for s in seqs]
    tokens: list[list[int]] = [[] for _ in seqs]
    for _ in range(steps):
        nxt = {s: [int(out[s][-1].argmax())] for s in seqs}
        out = driver.step(nxt)
        for s in seqs:
            tokens[s] += nxt[s]
            rows[s].append(out[s][-1].float())
    return rows, tokens


def prompts_for(arch: str) -> list[list[int]]:
    gen = torch.Generator().manual_seed(1)
    # LongRoPE: prompts within the original length, decodes past it (see models/rotary.py)
    lengths = (3, 9, 13) if arch == "phi3-longrope" else (3, 9, 17)
    return [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in lengths]


@pytest.mark.parametrize("arch", FAMILIES)
def test_logits_equal_transformers_prefill_then_decode(arch: str, device) -> None:
    hf = make_family_model(arch).to(device)
    prompts = prompts_for(arch)
    rows, tokens = run_ours(ours_from(hf, torch.float32, device), prompts, steps=8)
    assert max(len(p) + 8 for p in prompts) > max(WINDOW, LONGROPE_ORIGINAL)
    for prompt, ours, new in zip(prompts, rows, tokens, strict=True):
        want = hf_incremental(hf, prompt, new)
        for got, ref in zip(ours, want, strict=True):
            torch.testing.assert_close(got, ref, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "phi3-longrope"])
def test_bfloat16_logits_follow_transformers_in_bfloat16(arch: str, device) -> None:
    hf = make_family_model(arch).to(device=device, dtype=torch.bfloat16)
    prompts = prompts_for(arch)
    rows, tokens = run_ours(ours_from(hf, torch.bfloat16, device), prompts, steps=4)
    for prompt, ours, new in zip(prompts, rows, tokens, strict=True):
        want = hf_incremental(hf, prompt, new)
        for got, ref in zip(ours, want, strict=True):
            # bf16 rounding of different op orders: a few bf16 ulps of the logits' scale
            torch.testing.assert_close(got, ref, atol=0.1, rtol=0.02)


def test_the_oracle_sees_each_gemma_feature() -> None:
    """Caps, windows and the local rope base change transformers' logits at this scale, so the
    equality above could fail for each (a model that ignored one would not pass)."""
    prompt = prompts_for("gemma2")[2]
    base = make_family_model("gemma2")
    ref = hf_incremental(base, prompt, [])[0]
    for name, value in (
        ("attn_logit_softcapping", None),
        ("final_logit_softcapping", None),
        ("sliding_window", 64),
    ):
        other = make_family_model("gemma2")
        setattr(other.config, name, value)
        for layer in other.model.layers:
            layer.self_attn.attn_logit_softcapping = other.config.attn_logit_softcapping
            if name == "sliding_window" and layer.self_attn.sliding_window:
                layer.self_attn.sliding_window = value
        assert (hf_incremental(other, prompt, [])[0] - ref).abs().max() > 1e-2, name


def test_longrope_factors_change_the_logits_past_the_original_length() -> None:
    plain, scaled = make_family_model("phi3"), make_family_model("phi3-longrope")
    tokens = prompts_for("phi3")[2] + [5] * 8  # 25 tokens: short factors, then long ones
    a, b = (hf_incremental(m, tokens[:12], tokens[12:]) for m in (plain, scaled))
    assert (a[0] - b[0]).abs().max() > 1e-2  # the short factors already count
    assert all((x - y).abs().max() > 1e-2 for x, y in zip(a[6:], b[6:], strict=True))


def test_softcap_equals_tanh() -> None:
    x = torch.linspace(-200, 200, 40_001)
    torch.testing.assert_close(softcap(x, 30.0), 30.0 * torch.tanh(x / 30.0), atol=1e-5, rtol=0)


def test_unsupported_architectures_are_refused_with_the_supported_list() -> None:
    # Gemma 3 4B and larger ship as the multimodal Gemma3ForConditionalGeneration
    with pytest.raises(
        ValueError,
        match=r"'Gemma3ForConditionalGeneration'; tgserve supports: .*Gemma2ForCausalLM, "
        r"Gemma3ForCausalLM, .*Phi3ForCausalLM",
    ):
        ModelConfig.from_hf_dict({"architectures": ["Gemma3ForConditionalGeneration"]})
    bidirectional = make_family_model("gemma3").config.to_dict()
    bidirectional["use_bidirectional_attention"] = True  # EmbeddingGemma
    with pytest.raises(ValueError, match="use_bidirectional_attention"):
        ModelConfig.from_hf_dict(bidirectional)
