"""gpt-oss's MXFP4 expert tensors (as the released folders store them) are dequantised at load:
hand-worked bytes, and a tiny folder written per the format whose logits equal transformers'
model holding the same values dense, and transformers' own load of that folder. The test's encoder decodes codes by the E2M1 bit layout
(sign, 2 exponent bits, 1 mantissa bit), not by the loader's table."""

from __future__ import annotations

import pytest
import torch

from models.gpt_oss.mxfp4 import dequantize_mxfp4, mxfp4_experts
from models.loader import load_model
from tests.models.gpt_oss.checkpoint import make_gpt_oss, save_mxfp4_folder
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


def test_mxfp4_folder_equals_transformers_dense(tmp_path) -> None:
    hf = make_gpt_oss()
    gen = torch.Generator().manual_seed(5)
    c = hf.config
    save_mxfp4_folder(hf, tmp_path, gen)
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
