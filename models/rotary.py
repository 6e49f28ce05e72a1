"""Rotary position embedding: inverse frequencies (default, linear, Llama-3, YaRN and LongRoPE
scaling), the per-step cos/sin tables, and the rotation of q and k.

Contract: `RotaryEmbedding(rotary_dim, theta, scaling)(positions [T], dtype) -> (cos, sin)`, each
`[T, 1, rotary_dim]` in HF's rotate-half (non-interleaved) layout (`rotary_dim` is the head
dim, or fewer for a partial rotary: `apply_rotary` rotates a head's first dims only), computed in float32 and rounded
once to `dtype`, as transformers computes them. `reset()` recomputes its tables from the
arguments it was built with (a model built on the meta device lost them).

LongRoPE (Phi-3 / Phi-4, `rope_type` "longrope"): inverse frequencies divided by per-pair
`short_factor`s, or `long_factor`s, and cos/sin multiplied by the attention factor
(sqrt(1 + ln(factor) / ln(original_max_position_embeddings)) unless the config gives one).
The row at position p uses the long factors iff p >= original_max_position_embeddings. That is
transformers' choice in every decode step (it takes the long set when the forward's last
position + 1 exceeds the original length) and for every prompt shorter than that length; for a
prompt longer than it, transformers rotates the whole prompt with the long set in its one
forward, where a position rule gives the long set to positions >= the original length only.
YaRN (gpt-oss, `rope_type` "yarn"): each frequency blends its interpolated (/ factor) and its
original value by a linear ramp over the dims between the beta_fast and beta_slow rotation
counts at original_max_position_embeddings (floored / ceiled unless `truncate` is false), and
cos/sin are multiplied by the attention factor (0.1 ln(factor) + 1 unless the config gives one),
as transformers computes them.
Why a position rule: a key's rotation must not depend on how its prompt was cut into chunks,
on a prefix-cache hit or on a preemption (the same request gives the same answer), and the
decode forward stays free of host data (capturable).
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn

from models import triton_kernels

Rope = tuple[torch.Tensor, torch.Tensor]  # (cos, sin), each [T, 1, head_dim]


def _rope_kind(scaling: dict[str, Any] | None) -> str | None:
    return (scaling or {}).get("rope_type") or (scaling or {}).get("type")


def rope_inverse_frequencies(
    head_dim: int, theta: float, scaling: dict[str, Any] | None
) -> torch.Tensor:
    """[head_dim // 2] float32 inverse frequencies, with Llama-3 or linear scaling applied
    (LongRoPE's short set; `longrope_tables` gives both sets)."""
    # Computed on the CPU even under a meta-device context: meta math would pull in dynamo.
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    inv_freq = 1.0 / (theta**exponents)
    kind = _rope_kind(scaling)
    if kind is None or kind == "default":
        return inv_freq
    if kind == "linear":
        return inv_freq / float(scaling["factor"])
    if kind == "longrope":
        return longrope_tables(head_dim, theta, scaling)[0]
    if kind == "yarn":
        return yarn_table(head_dim, theta, scaling)[0]
    if kind == "llama3":
        factor = float(scaling["factor"])
        low, high = float(scaling["low_freq_factor"]), float(scaling["high_freq_factor"])
        old_len = float(scaling["original_max_position_embeddings"])
        wavelen = 2 * math.pi / inv_freq
        # Long wavelengths (low frequencies) are slowed by `factor`; short ones are kept; the
        # band in between blends the two linearly in old_len / wavelen.
        scaled = torch.where(wavelen > old_len / low, inv_freq / factor, inv_freq)
        smooth = (old_len / wavelen - low) / (high - low)
        blended = (1 - smooth) * scaled / factor + smooth * scaled
        in_band = (wavelen >= old_len / high) & (wavelen <= old_len / low)
        return torch.where(in_band, blended, scaled)
    raise ValueError(
        f"unsupported rope_scaling type {kind!r}; supported: default, linear, llama3, yarn, longrope"
    )


def longrope_tables(
    head_dim: int, theta: float, scaling: dict[str, Any]
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """(short inverse frequencies, long inverse frequencies, attention factor) of LongRoPE.
    `scaling` carries `original_max_position_embeddings` and `max_position_embeddings`
    (models/config.py puts them there from the top level of config.json when absent)."""
    exponents = torch.arange(0, head_dim, 2, dtype=torch.int64, device="cpu").float() / head_dim
    base = theta**exponents
    pairs = head_dim // 2
    sets = []
    for key in ("short_factor", "long_factor"):
        factors = torch.tensor(scaling[key], dtype=torch.float32, device="cpu")
        if factors.shape != (pairs,):
            raise ValueError(f"rope_scaling.{key} needs {pairs} values, got {tuple(factors.shape)}")
        sets.append(1.0 / (factors * base))
    original = float(scaling["original_max_position_embeddings"])
    factor = scaling.get("factor") or float(scaling["max_position_embeddings"]) / original
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1.0 else math.sqrt(1 + math.log(factor) / math.log(original))
    return sets[0], sets[1], float(attention)


def yarn_table(head_dim: int, theta: float, scaling: dict[str, Any]) -> tuple[torch.Tensor, float]:
    """(inverse frequencies [head_dim // 2] float32, attention factor) of YaRN (module doc)."""
    factor = float(scaling["factor"])
    original = float(scaling["original_max_position_embeddings"])
    attention = scaling.get("attention_factor")
    if attention is None:
        attention = 1.0 if factor <= 1 else 0.1 * math.log(factor) + 1.0

    def dim_of(rotations: float) -> float:  # the dim that turns `rotations` times in `original`
        return head_dim * math.log(original / (rotations * 2 * math.pi)) / (2 * math.log(theta))

    low = dim_of(float(scaling.get("beta_fast") or 32))
    high = dim_of(float(scaling.get("beta_slow") or 1))
    if scaling.get("truncate", True):
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, head_dim - 1)
    if low == high:
        high += 0.001  # a ramp of zero width: transformers' guard against dividing by 0
    base = theta ** (torch.arange(0, head_dim, 2, device="cpu").float() / head_dim)
    ramp = ((torch.arange(head_dim // 2, device="cpu").float() - low) / (high - low)).clamp(0, 1)
    kept = 1 - ramp  # the share of each frequency left as it was (extrapolated)
    inv_freq = 1.0 / (factor * base) * (1 - kept) + 1.0 / base * kept
    return inv_freq, float(attention)


class RotaryEmbedding(nn.Module):
    """cos/sin tables for a step's positions, in the rotate-half (non-interleaved) layout of
    HF; computed once per forward and shared by every layer (of one rope kind)."""

    def __init__(self, head_dim: int, theta: float, scaling: dict[str, Any] | None) -> None:
        super().__init__()
        self.head_dim, self.theta, self.scaling = head_dim, theta, scaling
        self.long_from: int | None = None  # LongRoPE: first position of the long factors
        self.attention_factor = 1.0
        self.register_buffer("inv_freq", torch.empty(head_dim // 2), persistent=False)
        self.register_buffer("long_inv_freq", torch.empty(0), persistent=False)
        self.reset()

    def reset(self) -> None:
        """(Re)computes the tables on the device of the current buffers."""
        device = self.inv_freq.device
        if _rope_kind(self.scaling) == "longrope":
            short, long, self.attention_factor = longrope_tables(
                self.head_dim, self.theta, self.scaling
            )
            self.long_from = int(self.scaling["original_max_position_embeddings"])
            self.long_inv_freq = long.to(device)
        elif _rope_kind(self.scaling) == "yarn":
            short, self.attention_factor = yarn_table(self.head_dim, self.theta, self.scaling)
        else:
            short = rope_inverse_frequencies(self.head_dim, self.theta, self.scaling)
        self.inv_freq = short.to(device)

    def forward(self, positions: torch.Tensor, dtype: torch.dtype) -> Rope:
        pos = positions.float().unsqueeze(-1)  # [T, 1]
        freqs = pos * self.inv_freq  # [T, D/2]
        if self.long_from is not None:
            freqs = torch.where(pos >= self.long_from, pos * self.long_inv_freq, freqs)
        emb = torch.cat((freqs, freqs), dim=-1)
        cos, sin = emb.cos(), emb.sin()
        if self.attention_factor != 1.0:
            cos, sin = cos * self.attention_factor, sin * self.attention_factor
        return cos.to(dtype).unsqueeze(1), sin.to(dtype).unsqueeze(1)  # [T, 1, D]


def rotate_qk(q: torch.Tensor, k: torch.Tensor, rope: Rope) -> tuple[torch.Tensor, torch.Tensor]:
    """q [T, H, D] and k [T, KVH, D] rotated by position: one Triton launch on the GPU (a
    whole-head rotary; a partial one runs the PyTorch code)."""
    if triton_kernels.enabled(q) and rope[0].shape[-1] == q.shape[-1]:
        from models.triton_kernels.rotary import rotary

        return rotary(q, k, *rope)
    return apply_rotary(q, rope), apply_rotary(k, rope)


def apply_rotary(x: torch.Tensor, rope: Rope) -> torch.Tensor:
    """x: [T, heads, head_dim] rotated by position; with tables narrower than the head
    (partial rotary, [T, 1, R]) only its first R dims rotate, the rest pass through."""
    cos, sin = rope
    rot = cos.shape[-1]
    if rot < x.shape[-1]:
        head, rest = x[..., :rot], x[..., rot:]
        return torch.cat((head * cos + _rotate_half(head) * sin, rest), dim=-1)
    return x * cos + _rotate_half(x) * sin


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)
