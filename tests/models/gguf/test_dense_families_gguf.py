"""Gemma 2, Gemma 3 and Phi-3 GGUF files, written here as llama.cpp's converter writes them
(tests/models/gguf/tiny_gguf.py: its tensor names, Gemma's norms stored as 1 + w, Phi-3's fused
qkv and gate-up, LongRoPE factors as tensors), load in tgserve to the tensors and the logits of
transformers' own GGUF loader reading the same file (the oracle).

transformers' GGUF reader takes Gemma's softcaps, query_pre_attn_scalar, sliding pattern and
local rope base from its config defaults (50 / 30, 256, every 6th layer global, 10000), not
from the file: the tiny models here use those values (head_dim 256, 6 layers for Gemma 3), so
both readers describe the model that was written. It reads no LongRoPE and no partial rotary
(Phi-4-mini) from a GGUF: those files are checked against the transformers model they were
written from.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as QT

from models.block_linear import BlockLinear
from models.loader import load_checkpoint, load_model
from tests.models.gguf.tiny_gguf import to_gguf
from tests.models.paged_driver import PagedDriver


def tiny_family(arch: str):
    torch.manual_seed(0)
    common = dict(
        vocab_size=96, hidden_size=32, intermediate_size=64, num_attention_heads=2,
        num_key_value_heads=1, max_position_embeddings=128, rms_norm_eps=1e-6,
        bos_token_id=2, eos_token_id=1, pad_token_id=0, initializer_range=0.1,
    )  # fmt: skip
    if arch == "gemma2":
        config = transformers.Gemma2Config(
            **common, num_hidden_layers=2, head_dim=256, sliding_window=5
        )
        model = transformers.Gemma2ForCausalLM(config)
    elif arch == "gemma3":
        config = transformers.Gemma3TextConfig(
            **common, num_hidden_layers=6, head_dim=256, sliding_window=5, rope_theta=1e6
        )
        model = transformers.Gemma3ForCausalLM(config)
    else:
        scaling = {}
        if arch == "phi3-longrope":
            pairs = range(8)
            scaling = dict(
                original_max_position_embeddings=8,
                rope_scaling={
                    "type": "longrope",
                    "short_factor": [1.0 + 0.5 * i for i in pairs],
                    "long_factor": [2.0 + 2.0 * i for i in pairs],
                },
            )
        if arch == "phi4-mini":
            scaling = dict(partial_rotary_factor=0.75)  # 12 of 16 dims rotate
        config = transformers.Phi3Config(**common, num_hidden_layers=2, **scaling)
        model = transformers.Phi3ForCausalLM(config)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if "norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
    model.config._attn_implementation = "eager"
    return model.eval()


def meta_for(arch: str, model) -> dict:
    c = model.config
    gguf_arch = "phi3" if arch.startswith("phi") else arch
    meta = {
        f"{gguf_arch}.block_count": c.num_hidden_layers,
        f"{gguf_arch}.context_length": c.max_position_embeddings,
        f"{gguf_arch}.embedding_length": c.hidden_size,
        f"{gguf_arch}.feed_forward_length": c.intermediate_size,
        f"{gguf_arch}.attention.head_count": c.num_attention_heads,
        f"{gguf_arch}.attention.head_count_kv": c.num_key_value_heads,
        f"{gguf_arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{gguf_arch}.vocab_size": c.vocab_size,
        "tokenizer.ggml.bos_token_id": 2,
        "tokenizer.ggml.eos_token_id": 1,
        "tokenizer.ggml.padding_token_id": 0,
    }
    if gguf_arch.startswith("gemma"):
        meta |= {
            f"{gguf_arch}.attention.key_length": c.head_dim,
            f"{gguf_arch}.attention.value_length": c.head_dim,
            f"{gguf_arch}.attention.sliding_window": c.sliding_window,
            f"{gguf_arch}.rope.freq_base": float(c.rope_parameters.get("rope_theta", 0.0))
            if gguf_arch == "gemma2"
            else 1e6,
        }
        if gguf_arch == "gemma2":
            meta |= {"gemma2.attn_logit_softcapping": 50.0, "gemma2.final_logit_softcapping": 30.0}
    else:
        meta |= {"phi3.rope.freq_base": 10000.0, "phi3.attention.sliding_window": 0}
        if arch == "phi3-longrope":
            meta["phi3.rope.scaling.original_context_length"] = 8
        if arch == "phi4-mini":  # llama.cpp writes the rotated dims here
            meta["phi3.rope.dimension_count"] = 12
    return meta


def longrope_tensors(model) -> dict[str, np.ndarray]:
    scaling = model.config.rope_parameters
    return {
        f"rope_factors_{k}.weight": np.array(scaling[f"{k}_factor"], dtype=np.float32)
        for k in ("long", "short")
    }


def logits(model, tokens: list[int]) -> torch.Tensor:
    driver = PagedDriver(model, block_size=4)
    seq = driver.add_sequence()
    return driver.step({seq: tokens})[seq].float()


@pytest.mark.parametrize("arch", ["gemma2", "gemma3", "phi3", "phi3-longrope", "phi4-mini"])
def test_gguf_equals_transformers(tmp_path, arch):
    hf = tiny_family(arch)
    extra = longrope_tensors(hf) if arch == "phi3-longrope" else None
    tied = arch.startswith("gemma")
    gguf_arch = "phi3" if arch.startswith("phi") else arch
    path = to_gguf(hf, tmp_path / "m.gguf", gguf_arch, tied, meta_for(arch, hf), extra)
    config, tensors = load_checkpoint(path, use_cache=False)
    assert config.architecture == type(hf).__name__
    want = {k: v for k, v in hf.state_dict().items() if not (tied and k == "lm_head.weight")}
    assert tensors.keys() == want.keys()
    for name, tensor in want.items():  # Gemma's norms went through + 1 - 1: float rounding
        torch.testing.assert_close(tensors[name], tensor, atol=1e-6, rtol=0)
    ours, _ = load_model(path, use_cache=False, dequantize=True)
    tokens = torch.randint(3, 96, (14,), generator=torch.Generator().manual_seed(1)).tolist()
    if arch == "phi3-longrope":
        assert config.rope_scaling["long_factor"] == hf.config.rope_parameters["long_factor"]
    if arch == "phi4-mini":
        assert (config.head_dim, config.rotary_dim) == (16, 12)
    if arch in ("phi3-longrope", "phi4-mini"):
        # transformers' GGUF reader drops LongRoPE and the partial rotary: the written model
        with torch.no_grad():
            ref = hf(torch.tensor([tokens[:8]])).logits[0]
        torch.testing.assert_close(logits(ours, tokens[:8]), ref, atol=1e-4, rtol=0)
        return
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).eval()
    theirs.config._attn_implementation = "eager"
    for name, tensor in theirs.state_dict().items():
        if name in tensors:
            assert torch.equal(tensors[name], tensor), name
    with torch.no_grad():
        ref = theirs(torch.tensor([tokens])).logits[0]
    torch.testing.assert_close(logits(ours, tokens), ref, atol=1e-4, rtol=0)


@pytest.mark.cpu_kernels
def test_phi3_q8_0_matrices_are_served_as_stored(tmp_path):
    """Phi-3's fused attn_qkv / ffn_up blocks become one block layer each (no split, no
    dense copy) and give the logits of the dequantising load."""
    hf = tiny_family("phi3")
    path = to_gguf(hf, tmp_path / "q8.gguf", "phi3", False, meta_for("phi3", hf), qtype=QT.Q8_0)
    stored, _ = load_model(path, use_cache=False)
    layer = stored.model.layers[0]
    assert isinstance(layer.self_attn.qkv_proj, BlockLinear)
    assert isinstance(layer.mlp.gate_up_proj, BlockLinear)
    dense, _ = load_model(path, use_cache=False, dequantize=True)
    tokens = torch.randint(3, 96, (12,), generator=torch.Generator().manual_seed(2)).tolist()
    torch.testing.assert_close(logits(stored, tokens), logits(dense, tokens), atol=1e-4, rtol=0)
