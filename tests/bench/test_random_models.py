"""`--model random:NAME`: the named shapes are the published models' (parameter counts worked
out by hand from their config.json), and the builder makes exactly the tensors a checkpoint of
that shape would hold, seeded, in the asked dtype, without allocating the big ones here."""

from __future__ import annotations

import pytest
import torch

from bench.model_shapes import flops_per_token, weight_bytes_per_token
from bench.model_source import resolve_model
from bench.random_models import RANDOM_SHAPES, random_shape
from models.checkpoint_shapes import expected_shapes
from models.config import ModelConfig
from models.random_weights import INIT_STD, random_model


def _params(config: ModelConfig) -> int:
    shapes, required = expected_shapes(config)
    return sum(torch.Size(shapes[name]).numel() for name in required)


def test_shapes_have_the_published_parameter_counts() -> None:
    # Llama 3 8B: 32 x (attention 41,943,040 + MLP 176,160,768 + norms 8,192)
    # + embeddings and LM head 2 x 525,336,576 + final norm 4,096.
    llama8b = ModelConfig.from_hf_dict(RANDOM_SHAPES["llama3-8b"])
    assert _params(llama8b) == 8_030_261_248
    # Llama 3.2 1B: 16 x 60,821,504 + tied embeddings 262,668,288 + final norm 2,048.
    llama1b = ModelConfig.from_hf_dict(RANDOM_SHAPES["llama3-1b"])
    assert _params(llama1b) == 1_235_814_400
    assert (llama8b.num_heads, llama8b.num_kv_heads, llama8b.head_dim) == (32, 8, 128)
    # A batch-1 decode step streams every projection and the LM head once, one embedding row
    # instead of the table, norms (32 x 8,192 + 4,096) left out as negligible.
    assert weight_bytes_per_token(llama8b, 2) == 2 * (8_030_261_248 - 525_336_576 - 262_144)


def test_t5_small_shape_and_its_flops_per_token_match_transformers_model() -> None:
    """transformers' own T5 of the shape (on the meta device: no memory) is the oracle: its
    parameter count is the published t5-small's, and a token's FLOPs are twice the weights of
    the linear layers it passes through."""
    from transformers import AutoConfig, AutoModelForSeq2SeqLM

    hf_dict = RANDOM_SHAPES["t5-small"]
    kwargs = {k: v for k, v in hf_dict.items() if k not in ("architectures", "model_type")}
    with torch.device("meta"):
        hf = AutoModelForSeq2SeqLM.from_config(AutoConfig.for_model("t5", **kwargs))
    assert sum(p.numel() for p in hf.parameters()) == 60_506_624

    def linear_params(module, keep=lambda name: True) -> int:
        return sum(
            m.weight.numel()
            for name, m in module.named_modules()
            if isinstance(m, torch.nn.Linear) and keep(name)
        )

    config = resolve_model("random:t5-small").config
    # an encoder input token: the encoder's linears, and each decoder layer's cross K and V
    cross_kv = linear_params(hf.decoder, lambda n: "EncDecAttention." in n and n[-1] in "kv")
    assert flops_per_token(config, with_lm_head=False) == 2 * (linear_params(hf.encoder) + cross_kv)
    # a generated token: the decoder's linears but the cross K and V, and the LM head
    decoder = linear_params(hf.decoder) - cross_kv + hf.lm_head.weight.numel()
    assert flops_per_token(config, with_lm_head=True) == 2 * decoder


def test_resolve_model_names_the_random_shapes() -> None:
    source = resolve_model("random:llama3-8b")
    assert source.random_weights == RANDOM_SHAPES["llama3-8b"] and source.hf_folder is None
    assert source.config.num_layers == 32 and source.config.vocab_size == 128256
    with pytest.raises(ValueError, match="random:llama3-8b, random:llama3-1b"):
        random_shape("random:llama9")


def _scaled_down(name: str) -> dict:
    """The named shape's structure (GQA ratio, RoPE, tying) at a size a test can build."""
    small = dict(RANDOM_SHAPES[name])
    small.update(hidden_size=64, intermediate_size=96, num_hidden_layers=2, vocab_size=512)
    small.update(num_attention_heads=8, num_key_value_heads=2)
    small.pop("head_dim", None)
    return small


LLAMA_SHAPES = sorted(n for n, shape in RANDOM_SHAPES.items() if shape["model_type"] == "llama")


@pytest.mark.parametrize("name", LLAMA_SHAPES)
def test_the_builder_makes_every_checkpoint_tensor_seeded_in_the_dtype(name: str) -> None:
    model, config = random_model(_scaled_down(name), torch.bfloat16, "cpu", seed=3)
    state = model.state_dict()
    # Our layers fuse q/k/v and gate/up: 8 heads of 8 -> q 64 rows, 2 KV heads -> k, v 16 each.
    layer = "model.layers.1."
    assert state[layer + "self_attn.qkv_proj.weight"].shape == (64 + 2 * 16, 64)
    assert state[layer + "self_attn.o_proj.weight"].shape == (64, 64)
    assert state[layer + "mlp.gate_up_proj.weight"].shape == (2 * 96, 64)
    assert state[layer + "mlp.down_proj.weight"].shape == (64, 96)
    assert state["model.embed_tokens.weight"].shape == state["lm_head.weight"].shape == (512, 64)
    tied = model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    assert tied == config.tie_word_embeddings == RANDOM_SHAPES[name]["tie_word_embeddings"]
    # Exactly the parameters of a checkpoint of that shape, all in the asked dtype.
    assert sum(p.numel() for p in model.parameters()) == _params(config)
    assert {p.dtype for p in model.parameters()} == {torch.bfloat16}
    assert torch.equal(state["model.norm.weight"], torch.ones(64, dtype=torch.bfloat16))
    q = state[layer + "self_attn.qkv_proj.weight"].float()
    assert abs(q.std().item() - INIT_STD) < 0.1 * INIT_STD and abs(q.mean().item()) < 1e-3
    again, _ = random_model(_scaled_down(name), torch.bfloat16, "cpu", seed=3)
    other, _ = random_model(_scaled_down(name), torch.bfloat16, "cpu", seed=4)
    again_state = again.state_dict()
    assert all(torch.equal(state[k], again_state[k]) for k in state)
    assert not torch.equal(q, other.state_dict()[layer + "self_attn.qkv_proj.weight"].float())


def test_an_engine_on_random_weights_generates(monkeypatch) -> None:
    from engine import Engine, EngineConfig, SamplingParams

    config = EngineConfig(dtype="float32", device="cpu", max_num_seqs=4, max_model_len=64)
    engine = Engine.from_random_weights("random:small", _scaled_down("llama3-8b"), config)
    assert engine.tokenizer is None and engine.info.vocab_size == 512
    out = engine.generate([[5, 6, 7]], SamplingParams(max_tokens=4, ignore_eos=True))
    assert len(out[0].outputs[0].token_ids) == 4
