"""A transformers model holding exactly the seeded random weights tgserve builds for `random:NAME`.

Contract: `random_transformers_model(hf_config, dtype, device, seed)` builds tgserve's random
model (models/random_weights.py: same shape, dtype, device and seed as
`Engine.from_random_weights` with `EngineConfig.seed`), renames its tensors to the Hugging Face
checkpoint's names (tgserve fuses q/k/v into `qkv_proj` and gate/up into `gate_up_proj` rows in
that order, as models/llama.py's loader fills them: here the rows are split back as views, no
copy), and loads them into `AutoModelForCausalLM.from_config` on `device` by assignment, so the
two engines run the very same tensors and "same command" comparisons need no download. The
encoder-decoders (T5, BART: models/encdec keeps the checkpoint's module names) need no renaming
and load into `AutoModelForSeq2SeqLM`, their stacks' embeddings tied to the shared one as
transformers ties them. Another family raises ValueError. Every tensor of the transformers model
must be filled (ValueError naming the first missing or extra one).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

LLAMA_FAMILY = ("llama", "mistral", "qwen2", "qwen3")
ENCODER_DECODER = ("t5", "bart")
# transformers' names for the shared embedding inside each stack (tied to `shared.weight`)
_STACK_EMBEDDINGS = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight")


def random_transformers_model(
    hf_config: dict[str, Any], dtype: torch.dtype, device: str, seed: int
) -> torch.nn.Module:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForSeq2SeqLM

    from models.random_weights import random_model

    model_type = hf_config.get("model_type")
    if model_type not in LLAMA_FAMILY + ENCODER_DECODER:
        raise ValueError(f"random weights for transformers: no name map for {model_type!r}")
    ours, config = random_model(hf_config, dtype, device, seed)
    if model_type in ENCODER_DECODER:
        state = dict(ours.state_dict())
        for name in _STACK_EMBEDDINGS:
            state.setdefault(name, state["shared.weight"])
        auto_class = AutoModelForSeq2SeqLM
    else:
        state = hf_named_tensors(ours.state_dict(), config)
        auto_class = AutoModelForCausalLM
    del ours
    kwargs = {k: v for k, v in hf_config.items() if k not in ("architectures", "model_type")}
    hf_config_obj = AutoConfig.for_model(model_type, **kwargs)
    with torch.device(device):  # built where it runs; its random init is replaced below
        model = auto_class.from_config(hf_config_obj, dtype=dtype)
    expected = set(model.state_dict())
    if set(state) != expected:
        missing, extra = sorted(expected - set(state)), sorted(set(state) - expected)
        raise ValueError(
            f"random weights for transformers: missing {missing[:3]}, unexpected {extra[:3]}"
        )
    model.load_state_dict(state, assign=True)
    if hf_config_obj.tie_word_embeddings:
        model.tie_weights()
    return model.eval()


def hf_named_tensors(state: dict[str, torch.Tensor], config) -> dict[str, torch.Tensor]:
    """tgserve's Llama-family state dict under Hugging Face names (fused rows split as views)."""
    q = config.num_heads * config.head_dim
    kv = config.num_kv_heads * config.head_dim
    inter = config.intermediate_size
    splits = {
        "self_attn.qkv_proj": (
            ("self_attn.q_proj", q),
            ("self_attn.k_proj", kv),
            ("self_attn.v_proj", kv),
        ),
        "mlp.gate_up_proj": (("mlp.gate_proj", inter), ("mlp.up_proj", inter)),
    }
    out: dict[str, torch.Tensor] = {}
    for name, tensor in state.items():
        if name.endswith("rotary_emb.inv_freq"):
            continue  # a buffer transformers computes from the config
        fused = next((f for f in splits if f".{f}." in name), None)
        if fused is None:
            out[name] = tensor
            continue
        offset = 0
        for part, rows in splits[fused]:
            out[name.replace(f".{fused}.", f".{part}.")] = tensor[offset : offset + rows]
            offset += rows
        if offset != tensor.shape[0]:
            raise ValueError(f"{name}: {tensor.shape[0]} rows, the split covers {offset}")
    return out
