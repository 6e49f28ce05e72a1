"""A gpt-oss Hugging Face folder written as a GGUF file the way llama.cpp's convert_hf_to_gguf.py
(its GptOssModel) writes one, for the tests and the llama.cpp cross-check
(tests/models/gpt_oss/llamacpp_crosscheck.py).

Contract: `write_gpt_oss_gguf(folder, dest, float_type="F32")` reads `folder` (config.json,
model.safetensors, and tokenizer.json / tokenizer_config.json when present) and writes `dest`:
- architecture "gpt-oss"; keys block_count, context_length, embedding_length,
  feed_forward_length, attention.head_count(_kv), attention.key_length / value_length,
  rope.freq_base, attention.layer_norm_rms_epsilon, expert_count, expert_used_count,
  expert_feed_forward_length, attention.sliding_window, rope.scaling.{type, factor,
  original_context_length, yarn_beta_fast, yarn_beta_slow}, general.file_type;
- tensor names from gguf-py's own name map for MODEL_ARCH.GPT_OSS (`attn_sinks.weight`,
  `post_attention_norm`, `ffn_gate_inp` with its bias, 3-D `ffn_{gate,up,down}_exps` with
  biases); transformers' interleaved gate/up rows split (even rows gate, odd rows up), as the
  converter does (with `fuse_gate_up`, as its --fuse-gate-up-exps: one `ffn_gate_up_exps`
  holding gate's rows then up's); dense experts transposed to [E, out, in];
- MXFP4 experts (a folder holding `_blocks` / `_scales` pairs) written as stored, in GGML's
  MXFP4 block (type 39: the scale byte, then element j in byte j's low nibble and element
  j + 16 in its high nibble); every other weight matrix in `float_type` (F32, F16, BF16, or
  Q8_0 blocks by gguf's own quantize, as a llama-quantize'd file holds them);
  norms, sinks, the router and every bias (the experts' 2-D ones too) in F32, as the converter
  keeps 1-D tensors, ffn_gate_inp and whatever does not end in ".weight";
- the vocabulary as the converter's GPT-2 BPE path writes it (`tokenizer.ggml.model` "gpt2",
  `pre` "gpt-4o", tokens padded to vocab_size, CONTROL for special added tokens, merges and
  the special ids / chat template by gguf's SpecialVocab).
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
import torch
from safetensors.torch import load_file

QT = gguf.GGMLQuantizationType
# float_type -> (torch dtype the values take, or None: block-quantised by gguf; its GGML type;
# general.file_type)
_TYPES = {"F32": (torch.float32, QT.F32, gguf.LlamaFileType.ALL_F32),
          "F16": (torch.float16, QT.F16, gguf.LlamaFileType.MOSTLY_F16),
          "BF16": (torch.bfloat16, QT.BF16, gguf.LlamaFileType.MOSTLY_BF16),
          "Q8_0": (None, QT.Q8_0, gguf.LlamaFileType.MOSTLY_Q8_0)}  # fmt: skip
_MXFP4 = QT.MXFP4
_FUSED_NAME = gguf.TENSOR_NAMES[gguf.MODEL_TENSOR.FFN_GATE_UP_EXP]  # blk.{bid}.ffn_gate_up_exps


def hf_to_ggml_mxfp4(blocks: torch.Tensor, scales: torch.Tensor) -> np.ndarray:
    """transformers' blocks [..., G, 16] (element 2k low nibble of byte k, 2k + 1 high) and
    scales [..., G] -> GGML MXFP4 bytes [..., G * 17]."""
    codes = torch.stack((blocks & 0x0F, blocks >> 4), dim=-1).flatten(-2)  # [..., G, 32]
    qs = codes[..., :16] | (codes[..., 16:] << 4)
    packed = torch.cat((scales.unsqueeze(-1), qs), dim=-1)  # [..., G, 17]
    return np.ascontiguousarray(packed.flatten(-2).numpy())


def write_gpt_oss_gguf(
    folder: Path, dest: Path, float_type: str = "F32", fuse_gate_up: bool = False
) -> Path:
    cfg = json.loads((folder / "config.json").read_text())
    tensors = load_file(folder / "model.safetensors")
    dtype, qtype, file_type = _TYPES[float_type]
    mxfp4 = any(name.endswith("_blocks") for name in tensors)
    writer = gguf.GGUFWriter(str(dest), arch="gpt-oss")
    _write_keys(writer, cfg, gguf.LlamaFileType.MOSTLY_MXFP4_MOE if mxfp4 else file_type)
    if (folder / "tokenizer.json").is_file():
        _write_vocab(writer, folder, int(cfg["vocab_size"]))
    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GPT_OSS, cfg["num_hidden_layers"])

    def add(hf_name: str, value: torch.Tensor | np.ndarray, raw: object = None) -> None:
        name = names.get_name(hf_name, try_suffixes=(".weight", ".bias"))
        if ".gate_up_proj." in hf_name:  # fused: gguf-py 0.19 maps no GPT_OSS name to it
            layer, kind = hf_name.split(".")[2], hf_name.rpartition(".")[2]
            name = f"{_FUSED_NAME.format(bid=layer)}.{kind}"
        if name is None:
            raise ValueError(f"gguf-py maps no GPT_OSS tensor to {hf_name!r}")
        if raw is None:  # float tensors: weight matrices in float_type, the rest F32
            keep = value.dim() == 1 or ".router." in hf_name or hf_name.endswith(".bias")
            if not keep and dtype is None:  # block-quantised, as llama-quantize would
                value, raw = gguf.quants.quantize(value.float().numpy(), qtype), qtype
            else:
                value = value.float() if keep else value.to(dtype)
                as_np = value.view(torch.int16) if value.dtype == torch.bfloat16 else value
                value, raw = as_np.numpy(), None if keep else qtype
        writer.add_tensor(name, np.ascontiguousarray(value), raw_dtype=raw)

    def add_gate_up(template: str, gate, up, raw: object = None) -> None:
        """gate and up [E, I, ...] as two tensors, or as one (gate's rows, then up's)."""
        if not fuse_gate_up:
            add(template.format("gate_proj"), gate, raw)
            add(template.format("up_proj"), up, raw)
            return
        joined = np.concatenate((gate, up), 1) if raw is not None else torch.cat((gate, up), 1)
        add(template.format("gate_up_proj"), joined, raw)

    for hf_name, tensor in tensors.items():
        if ".mlp.experts." not in hf_name:
            add(hf_name + (".weight" if hf_name.endswith("sinks") else ""), tensor)
            continue
        stem, _, part = hf_name.rpartition(".")
        if part == "gate_up_proj_bias":
            add_gate_up(f"{stem}.{{}}.bias", tensor[:, 0::2], tensor[:, 1::2])
        elif part == "down_proj_bias":
            add(f"{stem}.down_proj.bias", tensor)
        elif part in ("gate_up_proj_blocks", "down_proj_blocks"):
            proj = part.removesuffix("_blocks")
            scales = tensors[f"{stem}.{proj}_scales"]
            if proj == "down_proj":
                add(f"{stem}.down_proj.weight", hf_to_ggml_mxfp4(tensor, scales), _MXFP4)
                continue
            gate, up = (hf_to_ggml_mxfp4(tensor[:, r::2], scales[:, r::2]) for r in (0, 1))
            add_gate_up(f"{stem}.{{}}.weight", gate, up, _MXFP4)
        elif part == "gate_up_proj":  # [E, H, 2I] -> gate and up [E, I, H]
            rows = tensor.transpose(1, 2)
            add_gate_up(f"{stem}.{{}}.weight", rows[:, 0::2], rows[:, 1::2])
        elif part == "down_proj":  # [E, I, H] -> [E, H, I]
            add(f"{stem}.down_proj.weight", tensor.transpose(1, 2))
        elif not part.endswith("_scales"):
            raise ValueError(f"{folder}: unexpected expert tensor {hf_name!r}")
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return dest


def _write_keys(writer: gguf.GGUFWriter, cfg: dict, file_type: gguf.LlamaFileType) -> None:
    rope = cfg.get("rope_parameters") or cfg.get("rope_scaling") or {}
    head_dim = cfg["head_dim"]
    keys = (
        (writer.add_name, "gpt-oss"),
        (writer.add_block_count, cfg["num_hidden_layers"]),
        (writer.add_context_length, cfg["max_position_embeddings"]),
        (writer.add_embedding_length, cfg["hidden_size"]),
        (writer.add_feed_forward_length, cfg["intermediate_size"]),
        (writer.add_head_count, cfg["num_attention_heads"]),
        (writer.add_head_count_kv, cfg["num_key_value_heads"]),
        (writer.add_key_length, head_dim),
        (writer.add_value_length, head_dim),
        (writer.add_rope_freq_base, float(rope.get("rope_theta") or cfg.get("rope_theta"))),
        (writer.add_layer_norm_rms_eps, cfg["rms_norm_eps"]),
        (writer.add_expert_count, cfg["num_local_experts"]),
        (writer.add_expert_used_count, cfg["num_experts_per_tok"]),
    )
    for add_key, value in keys:
        add_key(value)
    if rope.get("rope_type") == "yarn":
        writer.add_rope_scaling_type(gguf.RopeScalingType.YARN)
        writer.add_rope_scaling_factor(rope["factor"])
        writer.add_rope_scaling_orig_ctx_len(rope["original_max_position_embeddings"])
        for key, add in (("beta_fast", writer.add_rope_scaling_yarn_beta_fast),
                         ("beta_slow", writer.add_rope_scaling_yarn_beta_slow)):  # fmt: skip
            if rope.get(key) is not None:
                add(rope[key])
    writer.add_file_type(file_type)
    writer.add_sliding_window(cfg["sliding_window"])
    writer.add_expert_feed_forward_length(cfg["intermediate_size"])


def _write_vocab(writer: gguf.GGUFWriter, folder: Path, vocab_size: int) -> None:
    data = json.loads((folder / "tokenizer.json").read_text())
    added = {t["id"]: t for t in data.get("added_tokens") or ()}
    by_id = {i: text for text, i in data["model"]["vocab"].items()} | {
        i: t["content"] for i, t in added.items()
    }
    tokens, types = [], []
    for i in range(vocab_size):
        if i not in by_id:
            tokens.append(f"[PAD{i}]")
            types.append(gguf.TokenType.UNUSED)
        elif i in added:
            tokens.append(by_id[i])
            special = added[i].get("special") or by_id[i].startswith("<|")
            types.append(gguf.TokenType.CONTROL if special else gguf.TokenType.USER_DEFINED)
        else:
            tokens.append(by_id[i])
            types.append(gguf.TokenType.NORMAL)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre("gpt-4o")
    writer.add_token_list(tokens)
    writer.add_token_types(types)
    gguf.SpecialVocab(folder, load_merges=True, n_vocab=vocab_size).add_to_gguf(writer)
