"""gpt-oss GGUF files as llama.cpp's converter writes them (architecture "gpt-oss"): their config
keys, and their tensors back under transformers' names and layouts.

Contract:
- `gpt_oss_config(gguf, key)` returns the config.json keys the "gpt-oss" architecture adds to the
  generic ones (models/gguf/config.py): `expert_count`, `expert_used_count`,
  `expert_feed_forward_length` (the experts' width), `attention.sliding_window` on the even
  layers (llama.cpp's fixed pattern of 2: sliding, full, ...), YaRN from `rope.scaling.*` (its
  beta_fast / beta_slow keys, else 32 / 1; not truncated, as every gpt-oss config says; a file
  with llama.cpp's yarn attn / ext factor or log multiplier keys is refused naming the key) or
  no scaling when the file has none, attention biases, and the SwiGLU clamp 7.0 and alpha 1.702
  that llama.cpp hard-codes (the file holds no key for them). End of generation: the file's eos
  / eot ids and the vocabulary's `<|return|>`, `<|call|>` and `<|endoftext|>` (the released
  generation_config.json's three; llama.cpp stops on them too).
- `gpt_oss_tensors(gguf)` yields `(gguf_name, hf_name, tensor)` for every tensor, after checking
  that every tensor a gpt-oss layer needs is in the file (`ValueError` naming the file and the
  first missing GGUF tensor). llama.cpp's converter splits transformers' interleaved gate/up rows
  (even rows gate, odd rows up) into `ffn_gate_exps` / `ffn_up_exps` [E, I, H] and their biases
  [E, I] (or, with its --fuse-gate-up-exps, into one `ffn_gate_up_exps` [E, 2I, H] holding
  gate's rows then up's, and its bias); they are interleaved back into
  `mlp.experts.gate_up_proj` [E, H, 2I] and `gate_up_proj_bias` [E, 2I]; `ffn_down_exps` [E, H, I] becomes `down_proj` [E, I, H]. MXFP4
  expert tensors (the released files' type) become transformers' `_blocks` / `_scales` pairs,
  byte for byte (models/gpt_oss/mxfp4.ggml_to_hf_blocks), so they stay 4-bit until the model
  takes them, as a folder's do; experts of any other type are dequantised. `attn_sinks.weight`
  is `self_attn.sinks`, `ffn_gate_inp` the router, `post_attention_norm` the post-attention norm.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import torch
from gguf import GGMLQuantizationType

from models.gguf.file import GGUFFile
from models.gguf.header import read_header
from models.gpt_oss.mxfp4 import ggml_to_hf_blocks

ARCH = "gpt-oss"
# llama.cpp's constants for gpt-oss's clamped SwiGLU (no GGUF key holds them).
_SWIGLU_LIMIT, _SWIGLU_ALPHA = 7.0, 1.702
# The released generation_config.json's end-of-generation tokens.
_STOP_TOKENS = ("<|return|>", "<|endoftext|>", "<|call|>")
_TOKENS_KEY = "tokenizer.ggml.tokens"
_TOKENS = frozenset({_TOKENS_KEY})
# YaRN keys the converter writes only for configs that gpt-oss's do not have.
_YARN_UNREAD = ("rope.scaling.yarn_attn_factor", "rope.scaling.yarn_ext_factor",
                "rope.scaling.yarn_log_multiplier")  # fmt: skip

_GLOBAL = {"token_embd.weight": "model.embed_tokens.weight",
           "output_norm.weight": "model.norm.weight", "output.weight": "lm_head.weight"}  # fmt: skip
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "attn_sinks.weight": "self_attn.sinks",
    "ffn_gate_inp.weight": "mlp.router.weight",
    "ffn_gate_inp.bias": "mlp.router.bias",
    "ffn_down_exps.bias": "mlp.experts.down_proj_bias",
} | {
    f"attn_{g}.{kind}": f"self_attn.{p}_proj.{kind}"
    for g, p in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o"))
    for kind in ("weight", "bias")
}
# Read in pairs or transposed (below), not by the table: gate and up split, as llama.cpp's
# converter writes them by default, or fused (gate rows, then up rows) by --fuse-gate-up-exps.
_SPLIT = ("ffn_gate_exps.weight", "ffn_up_exps.weight", "ffn_gate_exps.bias", "ffn_up_exps.bias")
_FUSED = ("ffn_gate_up_exps.weight", "ffn_gate_up_exps.bias")
_DOWN = "ffn_down_exps.weight"


def gpt_oss_config(gguf: GGUFFile, key: Callable[..., Any]) -> dict[str, Any]:
    layers = int(key("block_count"))
    window = key("attention.sliding_window")
    out: dict[str, Any] = {
        "architectures": ["GptOssForCausalLM"],
        "model_type": "gpt_oss",
        "num_local_experts": int(key("expert_count", required=True)),
        "num_experts_per_tok": int(key("expert_used_count", required=True)),
        "intermediate_size": int(key("expert_feed_forward_length", 0))
        or int(key("feed_forward_length", required=True)),
        "sliding_window": int(window) if window else None,
        "layer_types": [
            "sliding_attention" if window and n % 2 == 0 else "full_attention"
            for n in range(layers)
        ],
        "attention_bias": True,
        "swiglu_limit": _SWIGLU_LIMIT,
        "swiglu_alpha": _SWIGLU_ALPHA,
        "rope_scaling": _yarn(key),
    }
    eos = _stop_ids(gguf)
    return out | ({"eos_token_id": eos} if eos else {})


def _yarn(key: Callable[..., Any]) -> dict[str, Any]:
    kind = key("rope.scaling.type")
    if kind in (None, "none"):
        return {"rope_type": "default"}  # not the YaRN a config.json without keys defaults to
    if kind != "yarn":
        raise ValueError(f"gpt-oss rope scaling {kind!r} is not YaRN")
    for name in _YARN_UNREAD:  # llama.cpp's meaning differs from transformers': not guessed
        if key(name) is not None:
            raise ValueError(f"gpt-oss GGUF key {ARCH}.{name} is not read by tgserve")
    return {
        "rope_type": "yarn",
        "factor": float(key("rope.scaling.factor", required=True)),
        "original_max_position_embeddings": int(
            key("rope.scaling.original_context_length", required=True)
        ),
        "beta_fast": float(key("rope.scaling.yarn_beta_fast", 32.0)),
        "beta_slow": float(key("rope.scaling.yarn_beta_slow", 1.0)),
        "truncate": False,
    }


def _stop_ids(gguf: GGUFFile) -> list[int]:
    meta = gguf.metadata
    ids = [
        meta[k] for k in ("tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id") if k in meta
    ]
    if _TOKENS_KEY in gguf.array_lengths:  # the vocabulary: a long array, read now (alone)
        tokens = read_header(gguf.path, tensors=False, keep=_TOKENS).metadata[_TOKENS_KEY]
        ids += [i for i, t in enumerate(tokens) if t in _STOP_TOKENS]
    return list(dict.fromkeys(int(i) for i in ids))


def gpt_oss_tensors(gguf: GGUFFile) -> Iterator[tuple[str, str, torch.Tensor]]:
    gguf.check_types()
    _check_complete(gguf)
    for info in gguf.infos:
        name = info.name
        if name in _GLOBAL:
            yield name, _GLOBAL[name], gguf.tensor(info)
            continue
        layer, _, part = name.removeprefix("blk.").partition(".")
        stem, blk = f"model.layers.{layer}.", f"blk.{layer}."
        if not name.startswith("blk.") or part not in (*_LAYER, *_SPLIT, *_FUSED, _DOWN):
            raise ValueError(f"{gguf.path}: tensor {name!r} is not one tgserve knows for gpt-oss")
        if part in _LAYER:
            yield name, stem + _LAYER[part], gguf.tensor(info)
        elif part == _DOWN:
            yield from _projection(gguf, [name], stem + "mlp.experts.down_proj")
        elif part in ("ffn_gate_exps.weight", "ffn_gate_up_exps.weight"):  # gate with its up
            parts = [name] if "gate_up" in part else [name, blk + "ffn_up_exps.weight"]
            yield from _projection(gguf, parts, stem + "mlp.experts.gate_up_proj")
        elif part in ("ffn_gate_exps.bias", "ffn_gate_up_exps.bias"):
            parts = [name] if "gate_up" in part else [name, blk + "ffn_up_exps.bias"]
            bias = _gate_and_up([gguf.tensor(gguf.info(p)) for p in parts])  # [E, 2I]
            yield name, stem + "mlp.experts.gate_up_proj_bias", bias


def _check_complete(gguf: GGUFFile) -> None:
    """Every tensor a gpt-oss layer needs, split or fused gate/up alike, else ValueError."""
    names = gguf.tensor_names
    required = ["token_embd.weight", "output_norm.weight"]
    for n in range(int(gguf.metadata[f"{ARCH}.block_count"])):
        fused = f"blk.{n}.{_FUSED[0]}" in names
        required += [f"blk.{n}.{p}" for p in (*_LAYER, _DOWN, *(_FUSED if fused else _SPLIT))]
    missing = next((name for name in required if name not in names), None)
    if missing is not None:
        raise ValueError(f"{gguf.path}: gpt-oss GGUF lacks tensor {missing!r}")


def _gate_and_up(parts: list[torch.Tensor]) -> torch.Tensor:
    """gate and up [E, I, ...] (two tensors, or one holding gate's rows then up's) ->
    transformers' interleaved [E, 2I, ...]: row 2i gate's row i, row 2i + 1 up's."""
    gate, up = parts if len(parts) == 2 else parts[0].chunk(2, dim=1)
    return torch.stack((gate, up.to(gate.dtype)), dim=2).flatten(1, 2)


def _projection(
    gguf: GGUFFile, parts: list[str], hf_name: str
) -> Iterator[tuple[str, str, torch.Tensor]]:
    """One expert projection from its GGUF part(s) [E, N, K] (down: one; gate and up: two, or
    one fused): as MXFP4 `_blocks` [E, N', K / 32, 16] and `_scales` [E, N', K / 32] when every
    part is MXFP4, else dense in transformers' [E, K, N']."""
    infos = [gguf.info(p) for p in parts]
    gate_up = hf_name.endswith("gate_up_proj")
    if all(i.type_id == GGMLQuantizationType.MXFP4 for i in infos):
        blocks, scales = zip(*(ggml_to_hf_blocks(gguf.blocks(i)) for i in infos), strict=True)
        if gate_up:
            blocks, scales = (_gate_and_up(list(blocks)),), (_gate_and_up(list(scales)),)
        yield parts[0], hf_name + "_blocks", blocks[0]
        yield parts[0], hf_name + "_scales", scales[0]
        return
    dense = [gguf.tensor(i) for i in infos]
    tensor = _gate_and_up(dense) if gate_up else dense[0]
    yield parts[0], hf_name, tensor.transpose(1, 2).contiguous()  # [E, K, N']
