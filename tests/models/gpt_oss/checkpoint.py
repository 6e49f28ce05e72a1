"""A tiny seeded gpt-oss checkpoint made with transformers (the oracle).

`make_gpt_oss(window=8)`: 2 layers (sliding, then full), hidden 64, 4 query heads of 16 over
2 KV heads, 4 experts top-2 of width 32, vocab 320; YaRN rope with factor 4 over an original
length of 16 (the tests' sequences cross it). Random init leaves what makes gpt-oss itself at
zero or too small to show, so the sinks, the router and expert biases and the q/k/v/o biases
are drawn at scales that move the logits, and the SwiGLU clamp (`swiglu_limit` 1.0) bites.
`save_gpt_oss(folder)` writes it as a checkpoint folder looks; `save_mxfp4_folder(model, folder,
gen)` gives its experts random MXFP4 values and writes them as the released folders store them
(`_blocks` / `_scales` pairs, quant_method mxfp4), the model keeping the same values dense;
`gguf_checkpoint(matrices)` is the GGUF tests' and llamacpp_crosscheck.py's variant.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize
from safetensors.torch import load_file, save_file

from tests.checkpoints import VOCAB


def make_gpt_oss(seed: int = 0, window: int = 8, **overrides):
    import transformers as tf

    torch.manual_seed(seed)
    config = tf.GptOssConfig(
        **{
            "vocab_size": VOCAB,
            "hidden_size": 64,
            "intermediate_size": 32,
            "num_hidden_layers": 2,
            "num_attention_heads": 4,
            "num_key_value_heads": 2,
            "head_dim": 16,
            "num_local_experts": 4,
            "num_experts_per_tok": 2,
            "sliding_window": window,
            "max_position_embeddings": 64,  # = factor x original: YaRN as configured
            "initializer_range": 0.1,
            "swiglu_limit": 1.0,
            "rope_parameters": {
                "rope_type": "yarn",
                "rope_theta": 10000.0,
                "factor": 4.0,
                "beta_fast": 32.0,
                "beta_slow": 1.0,
                "truncate": False,
                "original_max_position_embeddings": 16,
            },
            "bos_token_id": 1,
            "eos_token_id": 2,
            "pad_token_id": 0,
            **overrides,
        }
    )
    config._attn_implementation = "eager"
    model = tf.GptOssForCausalLM(config).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("sinks", "router.bias")):
                param.normal_(0, 1.0)
            elif name.endswith(("_bias", "proj.bias")):
                param.normal_(0, 0.5)
            elif "norm" in name:
                param.add_(torch.randn_like(param) * 0.3)
    return model


def save_gpt_oss(folder: Path, seed: int = 0, **overrides) -> Path:
    make_gpt_oss(seed, **overrides).save_pretrained(folder)
    return folder


def e2m1(codes: torch.Tensor) -> torch.Tensor:
    """4-bit E2M1 codes decoded by their bit layout (sign, 2 exponent bits, 1 mantissa bit)."""
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


def save_mxfp4_folder(hf, folder: Path, gen: torch.Generator) -> Path:
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
    hf.save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    for name in packed:  # the dense tensors give way to their blocks and scales
        tensors.pop(name.removesuffix("_blocks").removesuffix("_scales"), None)
    save_file(tensors | packed, folder / "model.safetensors", metadata={"format": "pt"})
    config = json.loads((folder / "config.json").read_text())
    config["quantization_config"] = {"quant_method": "mxfp4"}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def gguf_checkpoint(matrices: str = "F32", **overrides):
    """The tiny gpt-oss with the released SwiGLU limit 7 and gate/up biases that pass it, its
    weight matrices (not the router's, not biases) rounded to what a `matrices` GGUF holds."""
    hf = make_gpt_oss(swiglu_limit=7.0, **overrides)
    with torch.no_grad():
        for layer in hf.model.layers:
            layer.mlp.experts.gate_up_proj_bias.mul_(20.0)  # N(0, 10): |x| > 7 for about half
        for name, param in hf.named_parameters():
            if param.dim() >= 2 and ".router." not in name and "bias" not in name:
                # experts [E, in, out] are stored [E, out, in]: Q8_0 blocks run along `in`
                rows = param.transpose(1, 2) if param.dim() == 3 else param
                rows.copy_(ROUND[matrices](rows.contiguous()))
    return hf


def _q8_0(w: torch.Tensor) -> torch.Tensor:  # gguf-py's own Q8_0, there and back
    return torch.from_numpy(dequantize(quantize(w.numpy(), QT.Q8_0), QT.Q8_0)).view(w.shape)


ROUND = {"F32": lambda w: w, "BF16": lambda w: w.bfloat16().float(),
         "F16": lambda w: w.half().float(), "Q8_0": _q8_0}  # fmt: skip
