"""Weight-only int8: the CPU kernel equals its dequantise-then-matmul reference, and the
quantised model stays close to the bf16 model it came from (the accuracy contract)."""

from __future__ import annotations

import torch
from torch import nn

from models import build_model
from models.config import ModelConfig
from models.quantization import Int8Linear, quantize_int8_weight_only
from tests.checkpoints import VOCAB, make_hf_model
from tests.models.paged_driver import PagedDriver


def test_int8_kernel_equals_dequantised_reference() -> None:
    torch.manual_seed(0)
    linear = nn.Linear(96, 40, bias=True).to(torch.bfloat16)
    q = Int8Linear(linear)
    x = torch.randn(5, 96, dtype=torch.bfloat16)
    torch.testing.assert_close(
        q(x).float(), (q.reference(x) + q.bias).float(), atol=2e-2, rtol=2e-2
    )
    # The int8 weights reproduce the original within half a quantisation step per row.
    dequant = q.weight_int8.float() * q.scale.float()[:, None]
    step = q.scale.float()[:, None]
    assert ((dequant - linear.weight.float()).abs() <= 0.51 * step + 1e-3).all()


def test_quantized_model_tracks_bf16_model() -> None:
    hf = make_hf_model("llama")
    config = ModelConfig.from_hf_dict(hf.config.to_dict())
    models = []
    for quantize in (False, True):
        m = build_model(config, torch.bfloat16, "cpu")
        m.load_weights(hf.state_dict().items())
        models.append(quantize_int8_weight_only(m) if quantize else m)
    assert not any(isinstance(mod, nn.Linear) for mod in models[1].modules())
    gen = torch.Generator().manual_seed(0)
    prompt = torch.randint(3, VOCAB, (40,), generator=gen).tolist()
    logits = []
    for m in models:
        driver = PagedDriver(m, block_size=4)
        seq = driver.add_sequence()
        logits.append(driver.step({seq: prompt})[seq].float())
    ref, quant = logits
    cos = torch.nn.functional.cosine_similarity(ref, quant, dim=-1)
    assert cos.min() > 0.99
    agree = (ref.argmax(-1) == quant.argmax(-1)).float().mean()
    assert agree >= 0.9
