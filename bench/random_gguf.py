"""A GGUF with random weights in a real model's shape and one GGML type, so CPU numbers are also
taken on a model of the size CPU users run; llama.cpp loads the very same file.

Contract: `write_random_gguf(dest, qtype, shape="llama-3.2-1b", vocab_from=None, seed=0)` writes
`dest` and returns it.
- Shape: `SHAPES[shape]` (Llama-3.2-1B: 16 layers, hidden 2048, intermediate 8192, 32 query /
  8 KV heads of 64, rope theta 500000, tied embeddings), written as llama.cpp's converter
  writes a Llama (names from gguf-py's map, `general.file_type` set to the type's); or
  "qwen3-moe-0.5b", a mixture of experts written as llama.cpp writes Qwen3-MoE (`qwen3moe`,
  3-D expert tensors, the router F32).
- Vocabulary: every `tokenizer.*` field of the GGUF `vocab_from` (default: the default model's,
  49152 GPT-2 BPE tokens; no Llama-3 tokenizer ships offline, so the embedding and the LM head
  are 49152 x 2048 unless a GGUF with that vocabulary is given, e.g. llama.cpp's
  ggml-vocab-llama-bpe.gguf from the llama-cpp-python sdist).
- Weights: seeded N(0, 0.02) matrices stored in `qtype` by `gguf.quants.quantize` (Q4_0, Q4_1,
  Q5_0, Q5_1, Q8_0, F16, BF16, F32) or bench/kquantize.py (Q4_K, Q5_K, Q6_K, which gguf-py
  cannot write), norms F32 ones. One tensor is made at a time (memory: the largest tensor).
- `qtype` "Q4_K_M" writes llama-quantize's Q4_K_M mix (`mix_type`): Q6_K for the output (the
  embedding when tied) and for attn_v / ffn_down of the layers llama.cpp gives more bits (the
  first and last eighth, and every third between), Q4_K for every other matrix.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from gguf import (
    MODEL_ARCH,
    GGMLQuantizationType,
    GGUFReader,
    GGUFValueType,
    GGUFWriter,
    LlamaFileType,
    get_tensor_name_map,
)
from gguf.quants import quant_shape_to_byte_shape, quantize

from bench.kquantize import KQUANT_TYPES, quantize_k

SHAPES: dict[str, dict[str, float | int]] = {
    "llama-3.2-1b": dict(
        block_count=16,
        embedding_length=2048,
        feed_forward_length=8192,
        head_count=32,
        head_count_kv=8,
        rope_freq_base=500000.0,
        rms_eps=1e-5,
        context_length=8192,
    ),  # fmt: skip
    # A Qwen3-MoE of ~0.47B parameters (0.40B in experts), ~0.13B active per token: 8 layers,
    # 32 experts of 512, top-4, q/k norms; the router stays F32 as llama-quantize keeps it.
    "qwen3-moe-0.5b": dict(
        arch="qwen3moe",
        block_count=8,
        embedding_length=1024,
        feed_forward_length=3072,
        head_count=16,
        head_count_kv=4,
        rope_freq_base=1000000.0,
        rms_eps=1e-6,
        context_length=8192,
        expert_count=32,
        expert_used_count=4,
        expert_feed_forward_length=512,
    ),  # fmt: skip
}
WRITABLE_TYPES = (
    "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0", "Q4_K", "Q5_K", "Q6_K", "Q4_K_M", "F16", "BF16", "F32"
)  # fmt: skip
MIXES = {"Q4_K_M": LlamaFileType.MOSTLY_Q4_K_M}


def write_random_gguf(
    dest: str | Path,
    qtype: str,
    shape: str = "llama-3.2-1b",
    vocab_from: str | Path | None = None,
    seed: int = 0,
) -> Path:
    if qtype not in WRITABLE_TYPES:
        raise ValueError(f"cannot write type {qtype!r}; choose one of: {', '.join(WRITABLE_TYPES)}")
    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; choose one of: {', '.join(SHAPES)}")
    from models.default_model import default_model_path

    s = SHAPES[shape]
    vocab = GGUFReader(vocab_from or default_model_path())
    vocab_size = len(vocab.fields["tokenizer.ggml.tokens"].data)
    writer = GGUFWriter(str(dest), arch=str(s.get("arch", "llama")))
    writer.add_name(f"random {shape} {qtype}")
    writer.add_file_type(
        MIXES[qtype] if qtype in MIXES else _file_type(GGMLQuantizationType[qtype])
    )
    writer.add_block_count(s["block_count"])
    writer.add_context_length(s["context_length"])
    writer.add_embedding_length(s["embedding_length"])
    writer.add_feed_forward_length(s["feed_forward_length"])
    writer.add_head_count(s["head_count"])
    writer.add_head_count_kv(s["head_count_kv"])
    writer.add_rope_freq_base(s["rope_freq_base"])
    writer.add_layer_norm_rms_eps(s["rms_eps"])
    writer.add_vocab_size(vocab_size)
    writer.add_rope_dimension_count(s["embedding_length"] // s["head_count"])
    if "expert_count" in s:  # mixture of experts (Qwen3-MoE as llama.cpp writes it)
        writer.add_key_length(s["embedding_length"] // s["head_count"])
        writer.add_value_length(s["embedding_length"] // s["head_count"])
        writer.add_expert_count(s["expert_count"])
        writer.add_expert_used_count(s["expert_used_count"])
        writer.add_expert_feed_forward_length(s["expert_feed_forward_length"])
    for field in vocab.fields.values():
        if field.name.startswith("tokenizer."):
            vtype = field.types[0]
            sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
            writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)
    tensors = _tensor_shapes(s, vocab_size)
    types = {
        name: mix_type(qtype, name, s["block_count"])
        if len(shape) >= 2 and "ffn_gate_inp" not in name
        else GGMLQuantizationType.F32
        for name, shape in tensors.items()
    }
    for name, rows_cols in tensors.items():
        stored = types[name]
        nbytes = int(np.prod(quant_shape_to_byte_shape(rows_cols, stored)))
        writer.add_tensor_info(name, rows_cols, np.dtype(np.float32), nbytes, stored)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    rng = np.random.default_rng(seed)
    for name, rows_cols in tensors.items():
        if len(rows_cols) == 1:
            writer.write_tensor_data(np.ones(rows_cols, dtype=np.float32))
            continue
        values = (rng.standard_normal(rows_cols, dtype=np.float32) * 0.02).astype(np.float32)
        writer.write_tensor_data(stored_values(values, types[name]))
    writer.close()
    return Path(dest)


def _tensor_shapes(s: dict, vocab_size: int) -> dict[str, tuple[int, ...]]:
    """GGUF name -> row-major shape, in llama.cpp's file order (tied: no output.weight)."""
    h, inter, layers = s["embedding_length"], s["feed_forward_length"], s["block_count"]
    head_dim = h // s["head_count"]
    kv = s["head_count_kv"] * head_dim
    names = get_tensor_name_map(MODEL_ARCH.LLAMA, layers)
    shapes = {"token_embd.weight": (vocab_size, h)}
    hf = {
        "input_layernorm": (h,), "self_attn.q_proj": (h, h), "self_attn.k_proj": (kv, h),
        "self_attn.v_proj": (kv, h), "self_attn.o_proj": (h, h),
        "post_attention_layernorm": (h,), "mlp.gate_proj": (inter, h), "mlp.up_proj": (inter, h),
        "mlp.down_proj": (h, inter),
    }  # fmt: skip
    if "expert_count" in s:
        return shapes | _moe_shapes(s)
    for i in range(layers):
        for part, shape in hf.items():
            shapes[f"{names.get_name(f'model.layers.{i}.{part}')}.weight"] = shape
    shapes["output_norm.weight"] = (h,)
    return shapes


def _moe_shapes(s: dict) -> dict[str, tuple[int, ...]]:
    """A Qwen3-MoE's layers as llama.cpp names them: the experts as 3-D [E, rows, cols]."""
    h, layers, e = s["embedding_length"], s["block_count"], s["expert_count"]
    d, i = h // s["head_count"], s["expert_feed_forward_length"]
    q, kv = s["head_count"] * d, s["head_count_kv"] * d
    shapes: dict[str, tuple[int, ...]] = {}
    for n in range(layers):
        shapes |= {f"blk.{n}.{name}.weight": shape for name, shape in (
            ("attn_norm", (h,)), ("attn_q", (q, h)), ("attn_k", (kv, h)), ("attn_v", (kv, h)),
            ("attn_q_norm", (d,)), ("attn_k_norm", (d,)), ("attn_output", (h, q)),
            ("ffn_norm", (h,)), ("ffn_gate_inp", (e, h)), ("ffn_gate_exps", (e, i, h)),
            ("ffn_up_exps", (e, i, h)), ("ffn_down_exps", (e, h, i)),
        )}  # fmt: skip
    shapes["output_norm.weight"] = (h,)
    return shapes


def mix_type(qtype: str, name: str, layers: int) -> GGMLQuantizationType:
    """The GGML type of matrix `name` in a file of `qtype` (a type, or a mix of `MIXES`)."""
    if qtype not in MIXES:
        return GGMLQuantizationType[qtype]
    if name in ("output.weight", "token_embd.weight"):  # tied: the embedding is the output
        return GGMLQuantizationType.Q6_K
    parts = name.split(".")
    if parts[0] == "blk" and parts[2] in ("attn_v", "ffn_down"):
        i = int(parts[1])  # llama.cpp's use_more_bits(i, layers)
        if i < layers // 8 or i >= 7 * layers // 8 or (i - layers // 8) % 3 == 2:
            return GGMLQuantizationType.Q6_K
    return GGMLQuantizationType.Q4_K


def stored_values(values: np.ndarray, qt: GGMLQuantizationType) -> np.ndarray:
    """float32 values as a GGUF stores them in type `qt` (quantised blocks, F32, F16, BF16)."""
    if qt in KQUANT_TYPES:
        return quantize_k(values, qt)
    if qt == GGMLQuantizationType.F32:
        return values
    if qt == GGMLQuantizationType.F16:
        return values.astype(np.float16)
    return quantize(values, qt)  # BF16 too: gguf's round-to-nearest-even bytes


def _file_type(qt: GGMLQuantizationType) -> LlamaFileType:
    return {
        GGMLQuantizationType.F32: LlamaFileType.ALL_F32,
        GGMLQuantizationType.F16: LlamaFileType.MOSTLY_F16,
        GGMLQuantizationType.BF16: LlamaFileType.MOSTLY_BF16,
    }.get(qt) or LlamaFileType[f"MOSTLY_{qt.name}"]
