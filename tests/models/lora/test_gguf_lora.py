"""A llama.cpp GGUF LoRA file (convert_lora_to_gguf's layout, written here with the gguf
package from a random peft adapter: Q/K lora_b rows interleaved as llama.cpp stores them for
the llama architecture) loads to the same adapter as the PEFT folder, and gives peft's logits;
files that are not LoRA adapters are refused with the reason."""

from __future__ import annotations

import gguf
import pytest
import torch

from models.config import ModelConfig
from models.lora import LoraRefused, load_adapter, load_peft_folder
from tests.checkpoints import make_hf_model
from tests.models.lora.peft_adapters import make_peft_adapter, ours_with_bank
from tests.models.paged_driver import PagedDriver
from tests.models.test_models_vs_transformers import hf_logits

_PARTS = {
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}


def interleave_rotary_rows(w: torch.Tensor, n_heads: int) -> torch.Tensor:
    """llama.cpp's conversion of Q/K rows (HF's half-split rotary pairs -> interleaved)."""
    return (
        w.reshape(n_heads, 2, w.shape[0] // n_heads // 2, *w.shape[1:])
        .swapaxes(1, 2)
        .reshape(w.shape)
    )


def write_gguf_lora(peft_model, path, hf_config, alpha: float, general_type: str = "adapter"):
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_string("general.type", general_type)
    writer.add_string("adapter.type", "lora")
    writer.add_float32("adapter.lora.alpha", alpha)
    heads = {"attn_q": hf_config.num_attention_heads, "attn_k": hf_config.num_key_value_heads}
    for name, module in peft_model.named_modules():
        for hf_part, part in _PARTS.items():
            if name.endswith(hf_part) and hasattr(module, "lora_A"):
                layer = int(name.split(".layers.")[1].split(".")[0])
                a = module.lora_A["default"].weight.detach()
                b = module.lora_B["default"].weight.detach()
                if part in heads:
                    b = interleave_rotary_rows(b, heads[part])
                stem = f"blk.{layer}.{part}.weight"
                writer.add_tensor(f"{stem}.lora_a", a.numpy().copy())
                writer.add_tensor(f"{stem}.lora_b", b.numpy().copy())
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_gguf_lora_equals_the_peft_folder(tmp_path) -> None:
    hf = make_hf_model("llama")
    peft_model = make_peft_adapter(hf, tmp_path / "peft", seed=21, r=4, lora_alpha=12)
    write_gguf_lora(peft_model, tmp_path / "a.gguf", hf.config, alpha=12.0)
    config = ModelConfig.from_hf_dict(hf.config.to_dict())
    from_gguf = load_adapter(tmp_path / "a.gguf", "g", config)
    from_peft = load_peft_folder(tmp_path / "peft", "p", config)
    assert from_gguf.modules.keys() == from_peft.modules.keys() and len(from_gguf.modules) == 14
    for key, want in from_peft.modules.items():
        got = from_gguf.modules[key]
        assert torch.equal(got.a, want.a) and torch.equal(got.b, want.b), key
        assert got.scale == want.scale == 3.0
    ours, bank = ours_with_bank(hf)
    bank.write(1, from_gguf)
    driver = PagedDriver(ours, block_size=4)
    seq = driver.add_sequence()
    prompt = list(range(5, 19))
    logits = driver.step({seq: prompt}, adapters={seq: 1})
    torch.testing.assert_close(logits[seq], hf_logits(peft_model, prompt), atol=1e-4, rtol=0)


def test_a_gguf_that_is_not_a_lora_adapter_is_refused(tmp_path) -> None:
    hf = make_hf_model("llama")
    peft_model = make_peft_adapter(hf, tmp_path / "peft", seed=22, target_modules=["v_proj"])
    write_gguf_lora(peft_model, tmp_path / "m.gguf", hf.config, 8.0, general_type="model")
    config = ModelConfig.from_hf_dict(hf.config.to_dict())
    with pytest.raises(LoraRefused, match="not a GGUF LoRA adapter"):
        load_adapter(tmp_path / "m.gguf", "m", config)
