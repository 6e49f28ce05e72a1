"""The real SmolLM2-135M-Instruct GGUF (Q4_1 + Q8_0 + F32): tensors equal transformers' own GGUF
loading, and logits from the cached folder equal transformers'."""

from __future__ import annotations

import shutil

import pytest
import torch

from models.attention import AttentionMetadata
from models.loader import load_checkpoint, load_model
from tests.devices import default_model_here


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory, smollm2_transformers):
    """(path, cache dir, transformers' own GGUF load of it, our converted tensors)."""
    path = default_model_here()
    cache = tmp_path_factory.mktemp("cache")
    theirs = smollm2_transformers  # tests/conftest.py: transformers' GGUF load, saved once
    config, tensors = load_checkpoint(path, cache_dir=cache)  # converts and fills the cache
    yield path, cache, theirs, config, tensors
    shutil.rmtree(cache, ignore_errors=True)  # 538 MB of float32


def test_smollm2_tensors_equal_transformers_gguf_loading(smollm2):
    _, _, theirs, config, tensors = smollm2
    want = theirs.state_dict()
    assert config.tie_word_embeddings and want["lm_head.weight"] is not None
    assert tensors.keys() == want.keys() - {"lm_head.weight"}
    for name, tensor in tensors.items():
        assert torch.equal(tensor, want[name]), name  # dequantised exactly, Q/K unpermuted
    hf = theirs.config
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (
        hf.num_hidden_layers, hf.hidden_size, hf.num_attention_heads, hf.num_key_value_heads,
    )  # fmt: skip
    assert (config.vocab_size, config.rope_theta, config.intermediate_size) == (
        hf.vocab_size, hf.rope_parameters["rope_theta"], hf.intermediate_size,
    )  # fmt: skip


def test_smollm2_logits_equal_transformers_from_the_cached_folder(smollm2):
    path, cache, theirs, _, _ = smollm2
    model, config = load_model(path, "float32", "cpu", cache_dir=cache, dequantize=True)
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (24,))
    meta = AttentionMetadata.build(
        block_tables=[[0, 1]], seq_lens=[24], query_lens=[24], block_size=16
    )
    shape = (2, 16, config.num_kv_heads, config.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(config.num_layers)]
    with torch.no_grad():
        ours = model.compute_logits(model(ids, torch.arange(24), meta, caches))
        want = theirs(ids[None]).logits[0].float()
    torch.testing.assert_close(ours, want, atol=1e-4, rtol=0)
