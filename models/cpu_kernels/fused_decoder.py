"""A whole forward step of a Llama-family model in one C++ call (models/cpu_kernels/decoder.cpp).

Why: SmolLM2-135M has 30 thin layers; eager PyTorch spends a decode step dispatching ~450
small ops, its bf16 matrix-vector product streams the weights at about half the memory
bandwidth, and in prefill its element-wise ops (each a pass over [tokens, hidden] with dtype
round trips) and SDPA at short chunks cost more than the matmuls. The C++ step runs each layer
as a handful of parallel loops: linear layers run one packed kernel for every batch size
(streaming the weights at memory speed at batch 1; linear.cpp), and every token, prefill or
decode, is one query of the paged attention kernel over its own context
(`AttentionMetadata.row_plan`).

Contract: `FusedDecoder.build(model, kv_caches)` returns None when the model is not one it
runs (not the Llama family, an MLP other than SwiGLU or a mixture of experts'
sparse block (models/cpu_kernels/moe_layer.py: router, top-k, experts and their weighted sum in
the same C++ call, moe_block.h), a partial rotary, a dtype other than float32 / bfloat16, weight-only int8 layers
with float32 activations, not on a CPU, or the extension cannot be built). Otherwise
`hidden(input_ids [T], positions [T], meta)` returns the final-normed hidden states
[T, hidden] that `LlamaForCausalLM.forward` would, writing the same K/V into the same cache slots; `logits(hidden [R, hidden])` returns
`compute_logits`'s [R, vocab] float32; `packed_bytes` is what its packed weight copies hold;
`huge_page_bytes` what was advised into 2 MiB pages (huge_pages.py: the linears' and the LM
head's packed weights, which a decode step streams). A model with a LoRA bank
(models/lora/bank.py) adds each row's adapter (`meta.lora_rows`) in every linear layer, reading
the bank's slots in place (models/cpu_kernels/lora.cpp). Rounding follows the eager path (tested in
tests/models/test_fused_decoder.py against it and against transformers). A row's values do not
depend on the other rows of the step (batch invariance: the linear and attention kernels fix
their reduction orders, see linear.cpp and attention.cpp). The model runner reaches it only
through the forward-path seam (models/forward_path.py). A tensor-parallel shard
(models/parallel) runs the same way on its heads and columns: the C++ step calls the group's
all-reduce after the o and down projections, and `logits` gathers the vocabulary shards. The
packed copies of the weights add the linear layers' bytes once more to memory, except GGUF
blocks kept as stored (models/block_linear.py): their packed blocks are the only copy, run by
block_linear.cpp (never sharded: tensor parallel dequantises them at load), and int8-activation
layers (models/activation_quant.py: Q8 panels, the only copy, run by q8_linear.cpp).
"""

from __future__ import annotations

import torch
from torch import nn

from models import cpu_kernels
from models.activation_quant import Q8Linear
from models.attention import AttentionMetadata, KVCache
from models.block_linear import BlockLinear
from models.cpu_kernels import huge_pages
from models.cpu_kernels.moe_layer import moe_weights, runs_sparse_block
from models.quantization import Int8Linear


class FusedDecoder:
    def __init__(self, model: nn.Module, ext, kv_caches: list[KVCache]) -> None:
        c = model.config
        inner = model.model
        # Bytes of the packed copies made here (GGUF blocks are run in place: no copy).
        self.packed_bytes = 0

        # The sparse blocks' ext.MoeWeights, shared with the C++ layers (a bench or a test
        # may set their `one_region`).
        self.moe_blocks: list = []

        # LoRA adapters (models/lora): the bank's slots, shared in place with the C++ layers.
        bank = getattr(model, "lora_bank", None)

        streamed: list[torch.Tensor] = []  # the packed weights a decode step reads

        def linear(layer: nn.Module, index: int, proj: str):
            bias = None if layer.bias is None else layer.bias.detach()
            lora = None if bank is None or proj is None else bank.layers[index][proj]
            if lora is not None:
                lora = ext.LoraWeights(a=lora.a, b=lora.b, scales=lora.scales, offsets=lora.offsets)
            if isinstance(layer, BlockLinear | Q8Linear):  # already packed, the only copy
                w = _panels(layer)
                kind = w.type_id if isinstance(layer, BlockLinear) else w.kind
                streamed.append(w.packed)
                return ext.LinearWeights(
                    weight=w.packed, packed=w.packed, bias=bias, block_type=kind,
                    out_features=w.out_features, lora=lora,
                )  # fmt: skip
            weight, scales = _weight_and_scales(layer)
            packed = ext.pack_linear(weight)
            self.packed_bytes += packed.nbytes
            streamed.append(packed)
            return ext.LinearWeights(
                weight=weight, packed=packed, bias=bias, scales=scales, lora=lora
            )

        def mlp(layer: nn.Module, index: int) -> dict:
            if not runs_sparse_block(layer.mlp):
                return dict(gate_up=linear(layer.mlp.gate_up_proj, index, "gate_up"),
                            down=linear(layer.mlp.down_proj, index, "down"))  # fmt: skip
            # Mixture of experts (models/moe): no LoRA bank serves these models.
            moe, packed = moe_weights(ext, layer.mlp, lambda m: linear(m, index, None))
            self.packed_bytes += packed
            self.moe_blocks.append(moe)
            return dict(moe=moe)

        layers = [
            ext.LayerWeights(
                input_norm=layer.input_layernorm.weight.detach(),
                qkv=linear(layer.self_attn.qkv_proj, i, "qkv"),
                o_proj=linear(layer.self_attn.o_proj, i, "o"),
                post_norm=layer.post_attention_layernorm.weight.detach(),
                q_norm=_norm_weight(layer.self_attn.q_norm),
                k_norm=_norm_weight(layer.self_attn.k_norm),
                **mlp(layer, i),
            )
            for i, layer in enumerate(inner.layers)
        ]
        self._model = model
        self._ext = ext
        # Tensor parallel (models/parallel): the LM head holds this rank's vocabulary rows and
        # gathers the logits; the attention knows its local head counts.
        self._gather = getattr(model.lm_head, "gather", None)
        group = getattr(model.lm_head, "group", None)
        attn = inner.layers[0].self_attn
        packed_head = isinstance(model.lm_head, BlockLinear | Q8Linear)
        self._lm_head_blocks = model.lm_head if packed_head else None
        if self._lm_head_blocks is None:
            lm_head, self._lm_head_scales = _weight_and_scales(model.lm_head)
            self._vocab_size = lm_head.shape[0]
            self._lm_head_packed = ext.pack_linear(lm_head)
            self.packed_bytes += self._lm_head_packed.nbytes
            streamed.append(self._lm_head_packed)
        else:
            streamed.append(_panels(model.lm_head).packed)
        # 2 MiB pages under the streamed weights: no TLB miss every 4 KiB (huge_pages.py)
        self.huge_page_bytes = huge_pages.advise(streamed)
        self._decoder = ext.LlamaDecoder(
            layers=layers,
            final_norm=inner.norm.weight.detach(),
            k_caches=[k for k, _ in kv_caches],
            v_caches=[v for _, v in kv_caches],
            num_heads=attn.num_heads,
            num_kv_heads=attn.num_kv_heads,
            head_dim=c.head_dim,
            eps=float(c.norm_eps),
            window=c.sliding_window or 0,
            all_reduce=None if group is None else group.all_reduce,
        )

    @classmethod
    def build(cls, model: nn.Module, kv_caches: list[KVCache]) -> FusedDecoder | None:
        from models.llama import LlamaForCausalLM

        if not isinstance(model, LlamaForCausalLM):
            return None
        moe = model.config.moe is not None
        if moe and getattr(model, "lora_bank", None) is not None:
            return None  # the sparse blocks take no LoRA adapters
        if not all(
            runs_sparse_block(layer.mlp) if moe and model.config.moe.is_sparse(i)
            else getattr(layer.mlp, "fused_silu", False)
            for i, layer in enumerate(model.model.layers)
        ):  # fmt: skip
            return None  # the C++ step's MLPs are SwiGLU, dense or mixture of experts
        if model.config.rotary_dim not in (None, model.config.head_dim):
            return None  # its rotary turns whole heads (Phi-4-mini's is partial)
        dtype = model.model.norm.weight.dtype
        if not _linears_it_runs(model, dtype):
            return None
        # The model's dtype, int8 rows with their scales (models/kv_quant.py), a float32
        # model's float16 rows (models/kv_half.py), or its float16 K with int8 V rows (int8v)
        rows = (dtype, torch.int8) + ((torch.float16,) if dtype == torch.float32 else ())
        if any(k.dtype not in rows or not k.is_contiguous() for cache in kv_caches for k in cache):
            return None
        k0, v0 = kv_caches[0]
        if k0.dtype != v0.dtype and (k0.dtype, v0.dtype) != (torch.float16, torch.int8):
            return None
        ext = cpu_kernels.extension()
        if ext is None:
            return None
        return cls(model, ext, kv_caches)

    @property
    def one_region(self) -> bool:
        """Whether decode steps of up to 8 rows run in one OpenMP region per layer (step_region.h)
        where `runs_one_region`; off: op by op. The same bits either way (a bench or a test
        switches it)."""
        return self._decoder.one_region

    @one_region.setter
    def one_region(self, on: bool) -> None:
        self._decoder.one_region = on

    @property
    def runs_one_region(self) -> bool:
        """The layers allow the one-region step: every linear Q8 panels or Q4_0 / Q4_1 / Q8_0
        blocks, dense SwiGLU MLPs or sparse blocks whose experts are such panels (no shared
        expert), no LoRA bank, no tensor parallel."""
        return self._decoder.region_layers

    def hidden(
        self, input_ids: torch.Tensor, positions: torch.Tensor, meta: AttentionMetadata
    ) -> torch.Tensor:
        """input_ids, positions [T] (a step's new tokens: decodes and prefill chunks, flat as
        the model runner lays them out) -> hidden [T, hidden]."""
        if sum(meta.query_lens) != input_ids.shape[0]:
            raise ValueError(
                f"the metadata describes {sum(meta.query_lens)} new tokens, got {input_ids.shape[0]}"
            )
        inner = self._model.model
        x = inner.embed_tokens(input_ids)  # [T, hidden]
        cos, sin = inner.rotary_emb(positions, x.dtype)  # [T, 1, D] each
        tables, lens = meta.row_plan()  # each token is one query of the attention kernel
        return self._decoder.forward(
            x=x,
            rope_cos=cos.squeeze(1).contiguous(),
            rope_sin=sin.squeeze(1).contiguous(),
            slots=meta.slot_mapping,
            tables=tables,
            seq_lens=lens,
            lora_rows=meta.lora_rows,  # each row's adapter slot (models/lora), or None
        )

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """[R, hidden] -> [R, vocab] float32 (accumulated in float32, never rounded to bf16)."""
        if self._lm_head_blocks is not None:
            return self._lm_head_blocks.apply(hidden, float_out=True)
        logits = self._ext.linear(
            hidden.contiguous(),
            self._lm_head_packed,
            None,
            self._vocab_size,
            True,
            self._lm_head_scales,
        )
        return logits if self._gather is None else self._gather(logits)


def _panels(layer: BlockLinear | Q8Linear):
    """A packed layer's weight: GGUF blocks as stored, or int8-activation Q8 panels."""
    return layer.block_weight if isinstance(layer, BlockLinear) else layer.q8_weight


def _norm_weight(norm: nn.Module | None) -> torch.Tensor | None:
    return None if norm is None else norm.weight.detach()


def _weight_and_scales(layer: nn.Module) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The weight to pack [N, K] (int8 for weight-only int8 layers, with their float32 row
    scales [N]; else the layer's own weight and None)."""
    if isinstance(layer, Int8Linear):
        return layer.weight_int8.contiguous(), layer.scale.float().contiguous()
    return layer.weight.detach().contiguous(), None


def _linears_it_runs(model: nn.Module, dtype: torch.dtype) -> bool:
    """Plain linears (tensor-parallel shards included) and GGUF blocks as stored
    (models/block_linear.py) in float32 / bfloat16 on a CPU, or weight-only int8 ones with
    bfloat16 activations (the int8 kernel widens the weights to bf16 pairs); anything else keeps
    its path."""
    from models.parallel.layers import RowParallelLinear

    packed = BlockLinear | Q8Linear  # GGUF blocks, or int8 activations (models/activation_quant)
    layers = [m for m in model.modules() if isinstance(m, nn.Linear | Int8Linear | packed)]
    if model.model.norm.weight.device.type != "cpu" or dtype not in (torch.float32, torch.bfloat16):
        return False
    plain = (nn.Linear, RowParallelLinear)
    if all(type(layer) in plain or isinstance(layer, packed) for layer in layers):
        return True
    return (
        all(isinstance(layer, Int8Linear | Q8Linear) for layer in layers)
        and dtype == torch.bfloat16
    )
