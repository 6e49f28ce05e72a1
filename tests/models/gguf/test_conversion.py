"""GGUF -> Hugging Face conversion (models/gguf/config.py, models/gguf/names.py through
load_checkpoint): tiny seeded models written as GGUF load to transformers' state_dict, config
keys map, Llama-3 rope scaling is recognised, and errors name the file and the tensor.
transformers' own GGUF loader reading the same file back is the check that the writer is right.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers

from models.loader import load_checkpoint
from tests.models.gguf.tiny_gguf import tiny_model, to_gguf, write_tensors


@pytest.mark.parametrize(
    ("arch", "tied"),
    [("llama", False), ("llama", True), ("qwen2", False), ("qwen3", True), ("gpt2", True)],
)
def test_tiny_gguf_loads_to_transformers_state_dict(tmp_path, arch, tied):
    model, meta = tiny_model(arch, tied)
    # GPT-2 GGUFs carry no vocab_size key (transformers then counts the token list).
    tokens = [f"t{i}" for i in range(96)] if arch == "gpt2" else None
    path = to_gguf(model, tmp_path / f"{arch}.gguf", arch, tied, meta, tokens=tokens)
    config, tensors = load_checkpoint(path, use_cache=False)
    want = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    assert tensors.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(tensors[name], tensor), name
    assert config.tie_word_embeddings == tied
    assert config.architecture == type(model).__name__
    assert (config.num_layers, config.vocab_size, config.bos_token_id, config.eos_token_ids) == (
        2, 96, model.config.bos_token_id, (model.config.eos_token_id,),
    )  # fmt: skip
    if arch != "gpt2":
        assert (config.num_heads, config.num_kv_heads, config.rope_theta) == (6, 2, 5000.0)
        assert config.norm_eps == pytest.approx(1e-6) and config.attention_bias == (arch == "qwen2")
    # The writer follows llama.cpp: transformers' own GGUF loader reads it back to the same model.
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).state_dict()
    for name, tensor in tensors.items():
        assert torch.equal(theirs[name], tensor), name


def test_missing_vocab_size_is_taken_from_the_embedding(tmp_path):
    model, meta = tiny_model("llama", tied=True)
    del meta["llama.vocab_size"]
    tokens = [f"t{i}" for i in range(90)]  # a shorter token list must not win
    path = to_gguf(model, tmp_path / "v.gguf", "llama", True, meta, tokens=tokens)
    config, _ = load_checkpoint(path, use_cache=False)
    assert config.vocab_size == 96


def _llama3_factors(theta: float, head_dim: int, scaling: dict) -> np.ndarray:
    """What llama.cpp stores in rope_freqs.weight: plain inverse frequencies / transformers' scaled ones."""
    cfg = transformers.LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        rope_theta=theta,
        rope_scaling=dict(scaling),
    )
    init = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["llama3"]
    scaled, _ = init(cfg, "cpu")
    plain = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    return (plain / scaled).numpy().astype(np.float32)


def test_llama3_rope_freqs_tensor_becomes_llama3_rope_scaling(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    model, meta = tiny_model("llama", tied=True)
    meta["llama.rope.freq_base"] = 500000.0
    good = _llama3_factors(500000.0, 8, scaling)
    for name, factors in (("good", good), ("odd", good * 1.5)):
        extra = {"rope_freqs.weight": factors}
        to_gguf(model, tmp_path / f"{name}.gguf", "llama", True, meta, extra=extra)
    config, tensors = load_checkpoint(tmp_path / "good.gguf", use_cache=False)
    assert config.rope_scaling == scaling
    assert "rope_freqs.weight" not in tensors
    with pytest.raises(ValueError, match=r"odd\.gguf.*rope_freqs"):
        load_checkpoint(tmp_path / "odd.gguf", use_cache=False)


def test_not_a_gguf_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match=r"bad\.gguf"):
        load_checkpoint(bad, use_cache=False)


def test_gguf_errors_name_the_file_and_the_tensor(tmp_path):
    model, meta = tiny_model("llama", tied=True)
    wrong = meta | {"llama.feed_forward_length": 81}
    path = to_gguf(model, tmp_path / "wrong.gguf", "llama", True, wrong)
    with pytest.raises(ValueError, match=r"wrong\.gguf \(GGUF tensor 'blk\.0\.ffn_\w+\.weight'\)"):
        load_checkpoint(path, use_cache=False)
    extra = {"blk.0.mystery.weight": np.zeros(4, dtype=np.float32)}
    path = to_gguf(model, tmp_path / "odd.gguf", "llama", True, meta, extra=extra)
    with pytest.raises(ValueError, match=r"odd\.gguf: tensor 'blk\.0\.mystery\.weight'"):
        load_checkpoint(path, use_cache=False)
    path = write_tensors(
        tmp_path / "rwkv.gguf", {"x": (np.zeros(4, dtype=np.float32), None)}, arch="rwkv6"
    )
    with pytest.raises(ValueError, match=r"rwkv\.gguf: unsupported GGUF architecture 'rwkv6'"):
        load_checkpoint(path, use_cache=False)
