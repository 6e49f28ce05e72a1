"""gpt-oss equals transformers' GptOssForCausalLM through the paged KV cache: a batched prefill
of prompts of 5, 11 and 18 tokens (past the sliding window of 8 and YaRN's original length of
16), then batched decode steps; float32 loaded from a saved folder (1e-4), bfloat16 as close to
float32 as transformers' bfloat16. And the pieces that make the family, each against its own
oracle: YaRN's frequencies (transformers'), the attention sinks (float64 reference, and a
hand-worked one-key case), the clamped SwiGLU (transformers' expert)."""

from __future__ import annotations

import pytest
import torch

from models.attention import AttentionMetadata, reference_attention, write_kv
from models.block_attention import BlockPlan, block_attention
from models.config import ModelConfig
from models.gpt_oss.experts import clamped_swiglu
from models.loader import load_model
from models.rotary import yarn_table
from tests.models.gpt_oss.checkpoint import make_gpt_oss
from tests.models.moe.test_moe_vs_transformers import (
    assert_bfloat16_as_close_as_transformers,
    ours_from,
    run_prefill_then_decode,
)
from tests.models.test_models_vs_transformers import hf_logits


def test_float32_logits_from_a_folder_equal_transformers(tmp_path, device) -> None:
    hf = make_gpt_oss()
    hf.save_pretrained(tmp_path)
    hf = hf.to(device)
    ours, config = load_model(tmp_path, "float32", device)
    assert config.layer_windows == (8, None) and config.rope_scaling["rope_type"] == "yarn"
    for got, want in run_prefill_then_decode(ours, lambda t: hf_logits(hf, t), 5):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_bfloat16_logits_as_close_to_float32_as_transformers_bfloat16(device) -> None:
    """Both round every op to bfloat16, in other orders (transformers keeps its norms in
    float32 and sums experts in bfloat16, we sum in float32 by rank): ours must stay as close
    to the float32 logits as transformers' bfloat16 model (within 2x), with the same greedy
    tokens wherever float32's top two are not close."""
    hf32 = make_gpt_oss().to(device)
    hf16 = make_gpt_oss().to(device=device, dtype=torch.bfloat16)
    ours = ours_from(hf16, torch.bfloat16, device, from_files=False)
    assert_bfloat16_as_close_as_transformers(ours, hf32, hf16)


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_frequencies_equal_transformers(truncate: bool) -> None:
    from transformers import GptOssConfig
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    yarn = {"rope_type": "yarn", "rope_theta": 150000.0, "factor": 32.0, "beta_fast": 32.0,
            "beta_slow": 1.0, "truncate": truncate, "original_max_position_embeddings": 4096}  # fmt: skip
    hf_config = GptOssConfig(head_dim=64, max_position_embeddings=131072, rope_parameters=yarn)
    want, want_factor = ROPE_INIT_FUNCTIONS["yarn"](hf_config, "cpu")
    got, factor = yarn_table(64, 150000.0, yarn)
    assert torch.equal(got, want) and factor == want_factor


def test_config_reads_a_released_config_json() -> None:
    """The fields as gpt-oss-20b's config.json spells them (rope_scaling, no rope_parameters,
    mxfp4 quantization_config); another quantization is refused by name."""
    d = {"architectures": ["GptOssForCausalLM"], "hidden_size": 2880, "intermediate_size": 2880,
         "num_hidden_layers": 4, "num_attention_heads": 64, "num_key_value_heads": 8,
         "head_dim": 64, "num_local_experts": 32, "num_experts_per_tok": 4, "vocab_size": 201088,
         "sliding_window": 128, "swiglu_limit": 7.0, "rope_theta": 150000,
         "layer_types": ["sliding_attention", "full_attention"] * 2,
         "rope_scaling": {"beta_fast": 32.0, "beta_slow": 1.0, "factor": 32.0,
                          "original_max_position_embeddings": 4096, "rope_type": "yarn",
                          "truncate": False},
         "quantization_config": {"quant_method": "mxfp4"}}  # fmt: skip
    c = ModelConfig.from_hf_dict(d)
    assert (c.family, c.layer_windows, c.rope_theta) == ("gpt_oss", (128, None) * 2, 150000.0)
    assert c.attention_bias and c.moe.top_k == 4 and c.moe.swiglu_limit == 7.0
    with pytest.raises(ValueError, match="quant_method 'fp8'"):
        ModelConfig.from_hf_dict(d | {"quantization_config": {"quant_method": "fp8"}})


def test_sink_takes_its_share_of_one_key() -> None:
    """One key: softmax over (score, sink) gives the value the weight 1 / (1 + e^(sink - s))."""
    q = torch.tensor([[[1.0, 0.0]]])  # [1, 1, 2]
    k, v = torch.tensor([[[2.0, 0.0]]]), torch.tensor([[[3.0, -1.0]]])
    sink = torch.tensor([0.5])
    out = reference_attention(q, k, v, scale=1.0, sinks=sink)
    weight = 1.0 / (1.0 + torch.exp(torch.tensor(0.5 - 2.0)))
    torch.testing.assert_close(out, v * weight)


@pytest.mark.parametrize("window", [None, 5])
def test_block_attention_with_sinks_equals_float64_reference(window) -> None:
    """A decode and a prefill chunk over a paged cache, past one key block (128 positions)."""
    gen = torch.Generator().manual_seed(0)
    heads, kv_heads, dim, block = 4, 2, 16, 16
    lens, q_lens = [140, 9], [1, 9]
    cache = tuple(torch.zeros(32, block, kv_heads, dim) for _ in range(2))
    tables = [list(range(0, 9)), list(range(20, 21))]
    ks = [torch.randn(n, kv_heads, dim, generator=gen) for n in lens]
    vs = [torch.randn(n, kv_heads, dim, generator=gen) for n in lens]
    meta_all = AttentionMetadata.build(tables, lens, lens, block)
    write_kv(cache, torch.cat(ks), torch.cat(vs), meta_all.slot_mapping)
    q = torch.randn(sum(q_lens), heads, dim, generator=gen)
    sinks = torch.randn(heads, generator=gen) * 2
    meta = AttentionMetadata.build(tables, lens, q_lens, block)
    plan = BlockPlan.build(meta, heads // kv_heads, window)
    got = block_attention(q, *cache, plan, 0.25, sinks=sinks)
    want = torch.cat(
        [
            reference_attention(qs, k, v, 0.25, window, sinks=sinks)
            for qs, k, v in zip(q.split(q_lens), ks, vs, strict=True)
        ]
    )
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)


def test_clamped_swiglu_equals_transformers_expert_gate() -> None:
    from transformers.models.gpt_oss.modeling_gpt_oss import GptOssExperts

    hf = GptOssExperts(make_gpt_oss().config)  # swiglu_limit 1.0, alpha 1.702
    gate_up = torch.randn(7, 64, generator=torch.Generator().manual_seed(0)) * 3
    torch.testing.assert_close(clamped_swiglu(gate_up, 1.702, 1.0), hf._apply_gate(gate_up))
