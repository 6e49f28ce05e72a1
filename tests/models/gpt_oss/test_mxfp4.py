"""gpt-oss's MXFP4 expert tensors (as the released folders store them) are dequantised at load:
hand-worked bytes, and a tiny folder written per the format whose logits equal transformers'
model holding the same values dense, and transformers' own load of that folder. The test's encoder decodes codes by the E2M1 bit layout
(sign, 2 exponent bits, 1 mantissa bit), not by the loader's table."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file, save_file

from models.gpt_oss.mxfp4 import dequantize_mxfp4, mxfp4_experts
from models.loader import load_model
from tests.models.gpt_oss.checkpoint import make_gpt_oss
from tests.models.paged_driver import PagedDriver
from tests.models.test_models_vs_transformers import hf_logits


def test_hand_worked_bytes() -> None:
    """Byte 0x2F at scale 128 (x2): low nibble 0xF = -6 -> -12 first, high 0x2 = 1 -> 2; byte
    0x71 at scale 125 (x1/4): 0x1 = 0.5 -> 0.125, 0x7 = 6 -> 1.5; zero bytes give zeros."""
    blocks = torch.zeros(2, 1, 16, dtype=torch.uint8)
    blocks[0, 0, 0], blocks[1, 0, 15] = 0x2F, 0x71
    scales = torch.tensor([[128], [125]], dtype=torch.uint8)
    want = torch.zeros(2, 32)
    want[0, :2] = torch.tensor([-12.0, 2.0])
    want[1, 30:] = torch.tensor([0.125, 1.5])
    got = dequantize_mxfp4(blocks, scales)
    assert got.dtype == torch.bfloat16 and torch.equal(got.float(), want)


def e2m1(codes: torch.Tensor) -> torch.Tensor:
    sign = 1.0 - 2.0 * ((codes >> 3) & 1).float()
    exponent, mantissa = ((codes >> 1) & 3).float(), (codes & 1).float()
    magnitude = torch.where(
        exponent == 0, mantissa / 2, torch.exp2(exponent - 1) * (1 + mantissa / 2)
    )
    return sign * magnitude


def quantized_pair(rows: int, cols: int, experts: int, gen) -> tuple[torch.Tensor, ...]:
    """(dense [E, rows, cols], blocks [E, rows, cols / 32, 16], scales [E, rows, cols / 32])."""
    codes = torch.randint(0, 16, (experts, rows, cols), generator=gen)
    scales = torch.randint(121, 126, (experts, rows, cols // 32), generator=gen)
    dense = e2m1(codes) * torch.exp2(scales.float() - 127).repeat_interleave(32, dim=-1)
    pairs = codes.view(experts, rows, cols // 32, 16, 2)
    blocks = (pairs[..., 0] | (pairs[..., 1] << 4)).to(torch.uint8)
    return dense, blocks, scales.to(torch.uint8)


def test_mxfp4_folder_equals_transformers_dense(tmp_path) -> None:
    hf = make_gpt_oss()
    gen = torch.Generator().manual_seed(5)
    c = hf.config
    e, h, i = c.num_local_experts, c.hidden_size, c.intermediate_size
    packed = {}
    with torch.no_grad():
        for n, layer in enumerate(hf.model.layers):
            for proj, rows, cols in (("gate_up_proj", 2 * i, h), ("down_proj", h, i)):
                dense, blocks, scales = quantized_pair(rows, cols, e, gen)
                getattr(layer.mlp.experts, proj).copy_(dense.transpose(1, 2))  # [E, in, out]
                name = f"model.layers.{n}.mlp.experts.{proj}"
                packed |= {f"{name}_blocks": blocks, f"{name}_scales": scales}
    hf.save_pretrained(tmp_path)
    tensors = load_file(tmp_path / "model.safetensors")
    for name in packed:  # the dense tensors give way to their blocks and scales
        tensors.pop(name.removesuffix("_blocks").removesuffix("_scales"), None)
    save_file(tensors | packed, tmp_path / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((tmp_path / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (tmp_path / "config.json").write_text(json.dumps(config))
    ours, _ = load_model(tmp_path, "float32", "cpu")
    prompt = torch.randint(3, c.vocab_size, (12,), generator=gen).tolist()
    driver = PagedDriver(ours)
    seq = driver.add_sequence()
    got = driver.step({seq: prompt})[seq]
    torch.testing.assert_close(got, hf_logits(hf, prompt), atol=1e-4, rtol=0)
    # transformers reads the folder as we wrote it (its own MXFP4 dequantisation)
    import transformers as tf

    hf_mxfp4 = tf.GptOssForCausalLM.from_pretrained(
        tmp_path, quantization_config=tf.Mxfp4Config(dequantize=True), dtype=torch.float32
    ).eval()
    torch.testing.assert_close(got, hf_logits(hf_mxfp4, prompt), atol=1e-4, rtol=0)


def test_a_pair_that_does_not_fit_is_refused_by_name() -> None:
    blocks = torch.zeros(2, 4, 3, 16, dtype=torch.uint8)
    with pytest.raises(ValueError, match="'m.experts.down_proj_blocks'"):
        mxfp4_experts({"m.experts.down_proj_blocks": blocks,
                       "m.experts.down_proj_scales": torch.zeros(2, 4, 2, dtype=torch.uint8)})  # fmt: skip
    pair = mxfp4_experts({"p_blocks": blocks, "p_scales": torch.zeros(2, 4, 3, dtype=torch.uint8)})
    assert pair["p"].shape == (2, 96, 4)  # transformers' [E, K, N], not dequantised yet
