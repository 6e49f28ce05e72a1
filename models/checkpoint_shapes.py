"""The tensor names and shapes a checkpoint must have for a given ModelConfig.

Contract: `check_checkpoint(config, tensors, origin)` raises `ValueError` naming the file (via
`origin(name)`) and the tensor when a tensor the config implies is missing or has another shape.
Names are transformers' state_dict names (`model.layers.0.self_attn.q_proj.weight`,
`transformer.h.0.attn.c_attn.weight` with GPT-2's Conv1D [in, out] layout). Tensors the table
does not know (e.g. old `rotary_emb.inv_freq` buffers) pass unchecked: the model's
`load_weights` decides about them. `lm_head.weight` is required only without tied embeddings.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from models.config import ModelConfig
from models.moe.shapes import moe_mlp_shapes

Shape = tuple[int, ...]


def expected_shapes(c: ModelConfig) -> tuple[dict[str, Shape], set[str]]:
    """(name -> shape for every tensor we know, names that must be present)."""
    if c.is_encoder_decoder:  # no table: their load_weights checks every name and shape
        return {}, set()
    if c.family == "gpt2":
        return _gpt2_shapes(c)
    return _llama_shapes(c)


def _llama_shapes(c: ModelConfig) -> tuple[dict[str, Shape], set[str]]:
    h, v, i = c.hidden_size, c.vocab_size, c.intermediate_size
    q, kv = c.num_heads * c.head_dim, c.num_kv_heads * c.head_dim
    shapes: dict[str, Shape] = {
        "model.embed_tokens.weight": (v, h),
        "model.norm.weight": (h,),
        "lm_head.weight": (v, h),
    }
    required = {"model.embed_tokens.weight", "model.norm.weight"}
    for n in range(c.num_layers):
        p = f"model.layers.{n}."
        layer: dict[str, Shape] = {
            "input_layernorm.weight": (h,),
            "post_attention_layernorm.weight": (h,),
            "self_attn.q_proj.weight": (q, h),
            "self_attn.k_proj.weight": (kv, h),
            "self_attn.v_proj.weight": (kv, h),
            "self_attn.o_proj.weight": (h, q),
            "mlp.gate_proj.weight": (i, h),
            "mlp.up_proj.weight": (i, h),
            "mlp.down_proj.weight": (h, i),
        }
        if c.moe is not None:  # a mixture-of-experts layer: its MLP is models/moe/shapes.py's
            layer = {k: s for k, s in layer.items() if not k.startswith("mlp.")}
            layer |= moe_mlp_shapes(c, n)
        if c.architecture == "Phi3ForCausalLM":  # stored fused: [q; k; v] and [gate; up]
            for name in ("q_proj", "k_proj", "v_proj"):
                del layer[f"self_attn.{name}.weight"]
            del layer["mlp.gate_proj.weight"], layer["mlp.up_proj.weight"]
            layer["self_attn.qkv_proj.weight"] = (q + 2 * kv, h)
            layer["mlp.gate_up_proj.weight"] = (2 * i, h)
        if c.family == "gemma":
            for norm in ("pre_feedforward_layernorm", "post_feedforward_layernorm"):
                layer[f"{norm}.weight"] = (h,)
        if c.family == "gpt_oss":  # attention sinks, one logit per query head
            layer["self_attn.sinks"] = (c.num_heads,)
        if c.qk_norm:
            layer |= {f"self_attn.{n}_norm.weight": (c.head_dim,) for n in ("q", "k")}
        required |= {p + k for k in layer}
        biases: dict[str, Shape] = {
            "self_attn.q_proj.bias": (q,),
            "self_attn.k_proj.bias": (kv,),
            "self_attn.v_proj.bias": (kv,),
        }
        if c.attention_bias:
            required |= {p + k for k in biases}
        layer |= biases | {"self_attn.o_proj.bias": (h,)}
        shapes |= {p + k: s for k, s in layer.items()}
    if not c.tie_word_embeddings:
        required.add("lm_head.weight")
    return shapes, required


def _gpt2_shapes(c: ModelConfig) -> tuple[dict[str, Shape], set[str]]:
    h, v, i = c.hidden_size, c.vocab_size, c.intermediate_size
    shapes: dict[str, Shape] = {
        "transformer.wte.weight": (v, h),
        "transformer.wpe.weight": (c.max_position_embeddings, h),
        "transformer.ln_f.weight": (h,),
        "transformer.ln_f.bias": (h,),
        "lm_head.weight": (v, h),
    }
    for n in range(c.num_layers):
        p = f"transformer.h.{n}."
        shapes |= {
            p + "ln_1.weight": (h,),
            p + "ln_1.bias": (h,),
            p + "attn.c_attn.weight": (h, 3 * h),  # Conv1D: [in, out]
            p + "attn.c_attn.bias": (3 * h,),
            p + "attn.c_proj.weight": (h, h),
            p + "attn.c_proj.bias": (h,),
            p + "ln_2.weight": (h,),
            p + "ln_2.bias": (h,),
            p + "mlp.c_fc.weight": (h, i),
            p + "mlp.c_fc.bias": (i,),
            p + "mlp.c_proj.weight": (i, h),
            p + "mlp.c_proj.bias": (h,),
        }
    required = set(shapes) - {"lm_head.weight"}
    if not c.tie_word_embeddings:
        required.add("lm_head.weight")
    return shapes, required


def check_checkpoint(
    config: ModelConfig, tensors: dict[str, torch.Tensor], origin: Callable[[str | None], str]
) -> None:
    """`origin(name)` names where a tensor came from (`origin(None)`: the checkpoint itself)."""
    shapes, required = expected_shapes(config)
    for name, tensor in tensors.items():
        want = shapes.get(name)
        if want is not None and tuple(tensor.shape) != want:
            raise ValueError(
                f"{origin(name)}: tensor {name!r} has shape {tuple(tensor.shape)} but the model "
                f"config ({_summary(config)}) implies {want}; the weights do not belong to this "
                "config"
            )
    missing = sorted(required - tensors.keys(), key=_natural_key)
    if missing:
        shown = ", ".join(repr(n) for n in missing[:3]) + (" ..." if len(missing) > 3 else "")
        raise ValueError(f"{origin(None)}: {len(missing)} tensor(s) missing, e.g. {shown}")


def _summary(c: ModelConfig) -> str:
    return (
        f"{c.architecture}, vocab {c.vocab_size}, hidden {c.hidden_size}, intermediate "
        f"{c.intermediate_size}, {c.num_layers} layers, {c.num_heads} heads / {c.num_kv_heads} "
        f"KV heads of {c.head_dim}"
    )


def _natural_key(name: str) -> list[tuple[int, str]]:
    # layer 2 before layer 10
    return [(int(p), "") if p.isdigit() else (-1, p) for p in name.split(".")]
