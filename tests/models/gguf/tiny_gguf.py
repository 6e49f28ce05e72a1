"""Writing GGUF files for the tests: raw tensors of any GGML type, and tiny seeded transformers
models written the way llama.cpp's convert_hf_to_gguf.py writes them.

GGUF files are written in llama.cpp's convention: names from gguf-py's own HF->GGUF name map,
Q/K rows permuted as llama.cpp's converter does for "llama", GPT-2 Conv1D weights transposed,
Gemma's norm weights stored plus one.
transformers' own GGUF loader reading the same file back (tests/models/gguf/test_conversion.py)
is the check that the writer is right.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import gguf
import numpy as np
import torch
import transformers
from gguf import GGMLQuantizationType as QT

from bench.kquantize import KQUANT_TYPES, quantize_k


def write_tensors(
    path: Path,
    tensors: dict[str, tuple[np.ndarray, QT | None]],
    arch: str = "llama",
    meta: dict[str, int | float] | None = None,
) -> Path:
    """`meta`: metadata keys, ints written as uint32, floats as float32."""
    writer = gguf.GGUFWriter(str(path), arch=arch)
    for key, value in (meta or {}).items():
        (writer.add_float32 if isinstance(value, float) else writer.add_uint32)(key, value)
    for name, (array, raw_dtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def to_gguf(
    model: torch.nn.Module,
    path: Path,
    arch: str,
    tied: bool,
    meta: dict,
    extra: dict[str, np.ndarray] | None = None,
    tokens: list[str] | None = None,
    qtype: QT | Callable[[str], QT] | None = None,
) -> Path:
    """Writes a transformers model the way llama.cpp's convert_hf_to_gguf.py would; with
    `qtype` (a type, or GGUF name -> type), every matrix (rank 2) is quantised to that GGML type
    by gguf's own quantize (K-quants, which gguf cannot write: bench/kquantize.py)."""
    cfg = model.config
    gguf_arch = {
        "llama": gguf.MODEL_ARCH.LLAMA,
        "qwen2": gguf.MODEL_ARCH.QWEN2,
        "qwen3": gguf.MODEL_ARCH.QWEN3,
        "gpt2": gguf.MODEL_ARCH.GPT2,
        "gemma2": gguf.MODEL_ARCH.GEMMA2,
        "gemma3": gguf.MODEL_ARCH.GEMMA3,
        "phi3": gguf.MODEL_ARCH.PHI3,
    }
    names = gguf.get_tensor_name_map(gguf_arch[arch], cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch=arch)
    for key, value in meta.items():
        {
            int: writer.add_uint32,
            float: writer.add_float32,
            str: writer.add_string,
            list: writer.add_array,
        }[type(value)](key, value)
    if tokens is not None:
        writer.add_token_list(tokens)
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array)
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        stem, suffix = hf_name.rsplit(".", 1)
        gguf_name = f"{names.get_name(stem)}.{suffix}"
        w = tensor.detach().clone()
        if arch == "llama" and gguf_name.split(".")[-2] in ("attn_q", "attn_k"):
            heads = cfg.num_attention_heads if "attn_q" in gguf_name else cfg.num_key_value_heads
            # llama.cpp: reshape(n_head, 2, rows/n_head/2, ...).swapaxes(1, 2)
            w = w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2)
            w = w.reshape(tensor.shape)
        if arch.startswith("gemma") and gguf_name.endswith("norm.weight"):
            w = w + 1  # llama.cpp stores Gemma's norms as the 1 + w they scale by
        if arch == "gpt2" and w.dim() == 2 and gguf_name.startswith("blk."):
            w = w.t()  # Conv1D [in, out] -> [out, in]
        array = np.ascontiguousarray(w.numpy())
        if qtype is not None and array.ndim == 2:
            stored = qtype(gguf_name) if callable(qtype) else qtype
            quantise = quantize_k if stored in KQUANT_TYPES else gguf.quants.quantize
            writer.add_tensor(gguf_name, quantise(array, stored), raw_dtype=stored)
        else:
            writer.add_tensor(gguf_name, array)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def tiny_model(arch: str, tied: bool) -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=96,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=1024,
            bos_token_id=0,
            eos_token_id=1,
        )
        meta = {
            "gpt2.block_count": 2,
            # transformers' GGUF reader maps context_length to n_ctx, not n_positions: keep 1024
            "gpt2.context_length": 1024,
            "gpt2.embedding_length": 32,
            "gpt2.feed_forward_length": 128,
            "gpt2.attention.head_count": 4,
            "gpt2.attention.layer_norm_epsilon": 1e-5,
            "tokenizer.ggml.bos_token_id": 0,
            "tokenizer.ggml.eos_token_id": 1,
        }
        return transformers.GPT2LMHeadModel(cfg).eval(), meta
    kwargs = dict(
        vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, rope_theta=5000.0, rms_norm_eps=1e-6,
        max_position_embeddings=128, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    cls, config_cls = {
        "qwen2": (transformers.Qwen2ForCausalLM, transformers.Qwen2Config),
        "qwen3": (transformers.Qwen3ForCausalLM, transformers.Qwen3Config),
    }.get(arch, (transformers.LlamaForCausalLM, transformers.LlamaConfig))
    if arch == "qwen3":  # head_dim 128, not hidden / heads = 8, as Qwen3 models do (and the
        kwargs["head_dim"] = 128  # value transformers' GGUF reader assumes: it skips key_length)
    model = cls(config_cls(**kwargs)).eval()
    with torch.no_grad():  # random biases, so a mix-up of bias rows would show
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    meta = {
        f"{arch}.block_count": 2,
        f"{arch}.context_length": 128,
        f"{arch}.embedding_length": 48,
        f"{arch}.feed_forward_length": 80,
        f"{arch}.attention.head_count": 6,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.rope.freq_base": 5000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.vocab_size": 96,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    if arch == "qwen3":
        meta |= {f"{arch}.attention.key_length": 128, f"{arch}.attention.value_length": 128}
    return model, meta
