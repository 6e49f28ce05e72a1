"""The default model served as stored (Q4_1 layers, Q8_0 tied embedding / LM head kept as blocks):
logits within a stated tolerance of transformers loading the same GGUF (it dequantises to
float32), through the C++ step the engine runs; and the engine answers the capital question.

Tolerance, float32: transformers multiplies the dequantised float32 weights; the blocks path
sums x * q per 32-wide block and scales by d (+ m * sum x), in float32 too, so only the order of
float32 additions differs. Through 30 layers that leaves the logits within 2e-3 of transformers'
(logits here span about +-30; observed max |difference| is recorded in the note). The engine's
default on an AVX2 build reads the blocks with int16 activations (engine/activation_choice.py):
the answer must be the float path's all the same."""

from __future__ import annotations

import torch

from engine import Engine, EngineConfig, SamplingParams
from engine.activation_choice import auto_mode
from models.activation_quant import Q8Linear
from models.block_linear import BlockEmbedding, BlockLinear
from models.cpu_kernels.fused_decoder import FusedDecoder
from models.loader import load_model
from tests.devices import default_model_here
from tests.models.paged_driver import PagedDriver


def test_default_model_as_stored_logits_match_transformers_gguf_loading(smollm2_transformers):
    theirs = smollm2_transformers  # tests/conftest.py: transformers' GGUF load, saved once
    model, _ = load_model(default_model_here(), "float32", "cpu")
    assert isinstance(model.model.embed_tokens, BlockEmbedding)
    assert isinstance(model.model.layers[0].mlp.down_proj, BlockLinear)
    assert model.lm_head.block_weight is model.model.embed_tokens.block_weight  # tied, one copy
    ids = torch.randint(
        0, model.config.vocab_size, (24,), generator=torch.Generator().manual_seed(0)
    )
    driver = PagedDriver(model)
    fused = FusedDecoder.build(model, driver.kv)
    assert fused is not None  # the C++ step, as the engine runs it
    ours = driver.step({driver.add_sequence(): ids.tolist()}, fused=fused)[0].double()
    with torch.no_grad():
        want = theirs(ids[None]).logits[0].double()
    assert (ours - want).abs().max() <= 2e-3, float((ours - want).abs().max())
    assert torch.equal(ours.argmax(-1), want.argmax(-1))


def test_default_model_as_stored_answers_the_capital_question() -> None:
    engine = Engine.from_model(str(default_model_here()), EngineConfig(max_model_len=512))
    stored = Q8Linear if auto_mode() else BlockLinear  # int16 activations, or float ones
    assert isinstance(engine.runner.model.model.layers[0].self_attn.qkv_proj, stored)
    prompt = "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n"
    out = engine.generate([prompt], SamplingParams(max_tokens=20, temperature=0.0))[0]
    assert out.outputs[0].text == "The capital of France is Paris."
