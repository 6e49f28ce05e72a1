"""Building blocks shared by the model files: norms, rotary embedding, MLPs, and the
self-attention block over the paged KV cache.

Every module takes flat token batches: activations are `[num_tokens, hidden]`, never padded
per sequence. Numerics follow transformers (norm statistics and rotary tables in float32).

Batch invariance (issue #14): every op here computes a row from that row alone in an order
fixed by the model's shapes: norms reduce each row over `hidden` (torch's row reductions
never split a row while there are several rows), rotary tables and activations use
position-independent elementwise code (models/pointwise.py), and the linears' order is
fixed by the forward path (models/linear_backend.invariant_linear).

On CUDA (where Triton is available) the norms (with the residual add before them), the
rotary of q and k and the SiLU x up run as the fused kernels of models/triton_kernels, each
tested against the PyTorch code here; elsewhere that code runs, unchanged.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from models import pointwise, triton_kernels
from models.attention import AttentionMetadata, KVCache, paged_attention, write_step_kv
from models.rotary import Rope, RotaryEmbedding, apply_rotary, rotate_qk

__all__ = [  # the rotary pieces (models/rotary.py) are re-exported for the model files
    "DecoderBlock",
    "GatedMLP",
    "GeluMLP",
    "LoraApply",
    "PagedSelfAttention",
    "RMSNorm",
    "Rope",
    "RotaryEmbedding",
    "apply_rotary",
    "embedding",
    "rms_normalize",
    "rotate_qk",
    "with_lora",
]

# A projection's LoRA: (its input [T, K], its output [T, N]) -> output + the adapters' deltas.
LoraApply = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def with_lora(lora: LoraApply | None, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return y if lora is None else lora(x, y)


class RMSNorm(nn.Module):
    def __init__(self, hidden: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(hidden))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if _fused(x, self.weight):
            from models.triton_kernels.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps)[0]
        return self.weight * rms_normalize(x.float(), self.eps).to(x.dtype)

    def add_and_norm(
        self, x: torch.Tensor, residual: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """(norm(x + residual), x + residual): a pre-norm block's residual add and the next
        norm, one kernel on the GPU."""
        if _fused(x, self.weight):
            from models.triton_kernels.rms_norm import rms_norm

            return rms_norm(x, self.weight, self.eps, residual)
        residual = x + residual
        return self(residual), residual


def rms_normalize(x32: torch.Tensor, eps: float) -> torch.Tensor:
    """x32 / sqrt(mean(x32^2) + eps) over the last dimension (float32 in, float32 out)."""
    return x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + eps)


def _fused(x: torch.Tensor, weight: torch.Tensor) -> bool:
    """Whether `x`'s op takes the fused Triton kernel (models/triton_kernels decides)."""
    return triton_kernels.enabled(x) and weight.dtype == x.dtype


def embedding(num_embeddings: int, dim: int) -> nn.Embedding:
    """An nn.Embedding left uninitialised (the checkpoint fills it). Why not the plain
    constructor: its random init under the meta device (models.build_meta_model) goes through
    torch's reference normal_, which imports torch._dynamo: ~150 MiB resident for nothing."""
    return nn.Embedding(num_embeddings, dim, _weight=torch.empty(num_embeddings, dim))


# Gated MLP activations by config name: SiLU (SwiGLU: Llama, Phi-3) and GELU (GeGLU: Gemma).
GATE_ACTIVATIONS = {
    "silu": pointwise.silu,
    "swish": pointwise.silu,
    "gelu_pytorch_tanh": pointwise.gelu_tanh,
    "gelu_new": pointwise.gelu_tanh,
    "gelu": pointwise.gelu_erf,
}


class GatedMLP(nn.Module):
    """down(act(gate(x)) * up(x)), gate and up fused into one projection (SwiGLU, GeGLU)."""

    def __init__(self, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        if act not in GATE_ACTIVATIONS:
            raise ValueError(
                f"unsupported hidden_act {act!r} for a gated MLP; supported: "
                + ", ".join(GATE_ACTIVATIONS)
            )
        self.act, self.fused_silu = GATE_ACTIVATIONS[act], act in ("silu", "swish")
        self.intermediate = intermediate
        self.gate_up_proj = nn.Linear(hidden, 2 * intermediate, bias=False)
        self.down_proj = nn.Linear(intermediate, hidden, bias=False)
        # LoRA adapters' (x, y) -> y + delta per projection (models/lora/bank.py), or None.
        self.gate_up_lora: LoraApply | None = None
        self.down_lora: LoraApply | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate_up = with_lora(self.gate_up_lora, x, self.gate_up_proj(x))  # [T, 2 * intermediate]
        if self.fused_silu and triton_kernels.enabled(gate_up):
            from models.triton_kernels.silu_mul import silu_mul

            act = silu_mul(gate_up)
        else:
            gate, up = gate_up.split(self.intermediate, dim=-1)
            act = self.act(gate) * up
        return with_lora(self.down_lora, act, self.down_proj(act))


class GeluMLP(nn.Module):
    """GPT-2's MLP: proj(gelu_tanh(fc(x)))."""

    def __init__(self, hidden: int, intermediate: int, act: str) -> None:
        super().__init__()
        if act not in ("gelu_new", "gelu_pytorch_tanh", "gelu"):
            raise ValueError(f"unsupported activation_function {act!r} for GPT-2")
        self.act = pointwise.gelu_erf if act == "gelu" else pointwise.gelu_tanh
        self.c_fc = nn.Linear(hidden, intermediate)
        self.c_proj = nn.Linear(intermediate, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.c_proj(self.act(self.c_fc(x)))


class PagedSelfAttention(nn.Module):
    """qkv projection (+ rotary) | write K/V to the paged cache and attend | out projection.

    `project` and the out projection are dense math a compiler may fuse; `attend` reads the
    per-step metadata (Python lists) and always runs eagerly.
    """

    def __init__(
        self,
        hidden: int,
        num_heads: int,
        num_kv_heads: int,
        head_dim: int,
        qkv_bias: bool,
        out_bias: bool,
        rotary: bool,
        qk_norm_eps: float | None = None,
    ) -> None:
        super().__init__()
        if num_heads % num_kv_heads:
            raise ValueError(
                f"num_heads ({num_heads}) must be a multiple of num_kv_heads ({num_kv_heads})"
            )
        self.num_heads, self.num_kv_heads, self.head_dim = num_heads, num_kv_heads, head_dim
        self.q_size, self.kv_size = num_heads * head_dim, num_kv_heads * head_dim
        self.qkv_proj = nn.Linear(hidden, self.q_size + 2 * self.kv_size, bias=qkv_bias)
        self.o_proj = nn.Linear(self.q_size, hidden, bias=out_bias)
        self.rotary = rotary
        self.scale = head_dim**-0.5
        # Qwen3: RMSNorm over each head's q and k (weights [head_dim]) before rotary.
        self.q_norm = None if qk_norm_eps is None else RMSNorm(head_dim, qk_norm_eps)
        self.k_norm = None if qk_norm_eps is None else RMSNorm(head_dim, qk_norm_eps)
        self.qkv_lora: LoraApply | None = None  # models/lora/bank.py, when adapters are on
        self.o_lora: LoraApply | None = None

    def project(
        self, x: torch.Tensor, rope: Rope | None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """x [T, hidden] -> q [T, H, D], k [T, KVH, D], v [T, KVH, D]."""
        qkv = with_lora(self.qkv_lora, x, self.qkv_proj(x))
        q, k, v = qkv.split([self.q_size, self.kv_size, self.kv_size], dim=-1)
        q = q.view(-1, self.num_heads, self.head_dim)
        k = k.view(-1, self.num_kv_heads, self.head_dim)
        v = v.view(-1, self.num_kv_heads, self.head_dim)
        if self.q_norm is not None and self.k_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        if self.rotary:
            q, k = rotate_qk(q, k, rope)
        return q, k, v

    def attend(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        meta: AttentionMetadata,
        cache: KVCache,
    ) -> torch.Tensor:
        """Stores k/v at their slots, attends over the cache: [T, H * D] (before o_proj)."""
        write_step_kv(cache, k, v, meta)
        return self.attention(q, cache, meta).reshape(-1, self.q_size)

    def attention(self, q: torch.Tensor, cache: KVCache, meta: AttentionMetadata) -> torch.Tensor:
        """q [T, H, D] over the cache, this step's K/V written -> [T, H, D]: the kernel of the
        backend that built `meta` (a family with per-layer attention options overrides it)."""
        return paged_attention(q, cache, meta, self.scale)

    def out(self, attn_out: torch.Tensor) -> torch.Tensor:
        """The out projection (with its LoRA when adapters are on): [T, q] -> [T, hidden]."""
        return with_lora(self.o_lora, attn_out, self.o_proj(attn_out))


class DecoderBlock(nn.Module):
    """A pre-norm transformer block split at the attention: `dense_in` (norm, qkv, rotary)
    and `dense_out` (out projection, residual, norm, MLP, residual) are plain tensor math;
    the paged attention between them is not. Subclasses define the two halves."""

    attn: PagedSelfAttention

    def dense_in(self, x: torch.Tensor, rope: Rope | None) -> tuple[torch.Tensor, ...]:
        raise NotImplementedError

    def dense_out(self, x: torch.Tensor, attn_out: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def forward(
        self, x: torch.Tensor, rope: Rope | None, meta: AttentionMetadata, cache: KVCache
    ) -> torch.Tensor:
        q, k, v = self.dense_in(x, rope)
        return self.dense_out(x, self.attn.attend(q, k, v, meta, cache))
