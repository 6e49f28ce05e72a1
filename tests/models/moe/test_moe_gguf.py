"""Mixture-of-experts GGUF files as llama.cpp writes them (tests/models/moe/moe_gguf.py)
load in tgserve with the logits of transformers: Qwen3-MoE and Qwen2-MoE against transformers'
own GGUF loader reading the same file (float32 and Q8_0 / Q4_0 blocks, dequantised by both),
Mixtral (stored as "llama" with experts, which transformers' GGUF loader does not read)
against the model the file was written from."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from models import cpu_kernels
from models.loader import load_model
from models.moe.stored_experts import BlockExperts
from tests.checkpoints import VOCAB, make_hf_model
from tests.models.moe.moe_gguf import write_moe_gguf
from tests.models.paged_driver import PagedDriver
from tests.models.test_models_vs_transformers import hf_logits

PROMPT = torch.randint(3, VOCAB, (13,), generator=torch.Generator().manual_seed(5)).tolist()


def our_logits(path, stored: bool = False) -> torch.Tensor:
    model, config = load_model(path, "float32", "cpu", use_cache=False)
    assert config.moe is not None
    if stored and cpu_kernels.extension() is not None:  # the experts' blocks kept as stored
        assert all(type(layer.mlp.experts) is BlockExperts for layer in model.model.layers)
    driver = PagedDriver(model, block_size=4)
    return driver.step({driver.add_sequence(): PROMPT})[0]


@pytest.mark.parametrize(
    "arch,gguf_arch,qtype",
    [("qwen3_moe", "qwen3moe", QT.Q8_0), ("qwen2_moe", "qwen2moe", QT.Q4_0),
     ("qwen2_moe", "qwen2moe", None)],
)  # fmt: skip
def test_qwen_moe_gguf_logits_equal_transformers_gguf_loading(arch, gguf_arch, qtype, tmp_path):
    import transformers

    # every layer sparse: llama.cpp's qwen3moe (and transformers' reader) has no dense layers
    hf = make_hf_model(arch, mlp_only_layers=[])
    path = write_moe_gguf(hf, tmp_path / "tiny.gguf", gguf_arch, qtype)
    # transformers' GGUF reader leaves moe_intermediate_size at its default: the config is
    # given; every tensor is still read (and dequantised) from the file by transformers.
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, config=hf.config
    ).eval()
    want = hf_logits(theirs, PROMPT)
    if qtype is None:  # float32: the file is the model
        torch.testing.assert_close(want, hf_logits(hf, PROMPT), atol=1e-5, rtol=0)
    torch.testing.assert_close(our_logits(path, stored=qtype is not None), want, atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch,gguf_arch", [("mixtral", "llama"), ("qwen3_moe", "qwen3moe")])
def test_moe_gguf_equals_its_source_model(arch, gguf_arch, tmp_path):
    """Mixtral as "llama" with experts; Qwen3-MoE with a dense first layer (no router tensor:
    mlp_only_layers from the file)."""
    hf = make_hf_model(arch)
    path = write_moe_gguf(hf, tmp_path / "tiny.gguf", gguf_arch, None)
    torch.testing.assert_close(our_logits(path), hf_logits(hf, PROMPT), atol=1e-4, rtol=0)


def test_experts_as_stored_are_batch_invariant(tmp_path):
    """A row alone equals it among rows sharing its experts, bit for bit, through the block
    kernels (Q4_0 experts as stored)."""
    if cpu_kernels.extension() is None:
        pytest.skip("the C++ kernels cannot be built here")
    hf = make_hf_model("qwen2_moe")
    path = write_moe_gguf(hf, tmp_path / "tiny.gguf", "qwen2moe", QT.Q4_0)
    model, _ = load_model(path, "float32", "cpu", use_cache=False)
    experts = model.model.layers[1].mlp.experts
    assert isinstance(experts, BlockExperts)
    gen = torch.Generator().manual_seed(3)
    x, weights = torch.randn(17, 64, generator=gen), torch.rand(17, 2, generator=gen)
    ids = torch.tensor([[5, 2]] * 17)
    batch = experts(x, ids, weights)
    for t in (0, 8, 16):
        assert torch.equal(experts(x[t : t + 1], ids[t : t + 1], weights[t : t + 1])[0], batch[t])
