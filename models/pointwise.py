"""Activations whose value for an element does not depend on where it sits in the tensor.

Why this exists (issue #14, batch invariance): torch's CPU elementwise kernels run a
vectorized body and a scalar tail (the last `numel mod 2 * vector width` elements of each
thread's range). For `F.silu`, `torch.sigmoid` and `F.gelu` the two are different code
(SLEEF vs libm) that disagree in the last bit for some float32 inputs, and which elements
land in the tail depends on the number of rows of the batch: a row's activations would
change with the batch. The functions here are built from ops whose every element is
computed by the same code wherever it sits: exact IEEE ops (neg, add, mul, div) and the
VML transcendentals (`torch.exp`, `torch.erf`: one vectorized map, the tail loaded into a
partial vector; checked at every tail position by tests/models/test_invariant_kernels.py).
Reduced-precision inputs are computed in float32 and rounded once, as torch's own kernels do.

Contract: `silu(x)`, `gelu_tanh(x)`, `gelu_erf(x)` take any shape and dtype and equal the
torch functions of the same name up to float32 rounding; `softcap(x, cap)` equals
`cap * torch.tanh(x / cap)` to a few float32 ulps of `cap`.
"""

from __future__ import annotations

import math

import torch

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


def silu(x: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(x) = x / (1 + exp(-x))."""
    xf = x.float()
    return (xf / (1.0 + torch.exp(-xf))).to(x.dtype)


def gelu_tanh(x: torch.Tensor) -> torch.Tensor:
    """0.5 x (1 + tanh(u)) with u = sqrt(2/pi) (x + 0.044715 x^3), written as
    x / (1 + exp(-2u)) (the same function: 0.5 (1 + tanh(u)) = sigmoid(2u))."""
    xf = x.float()
    u = _SQRT_2_OVER_PI * (xf + 0.044715 * (xf * xf * xf))
    return (xf / (1.0 + torch.exp(-2.0 * u))).to(x.dtype)


def gelu_erf(x: torch.Tensor) -> torch.Tensor:
    """0.5 x (1 + erf(x / sqrt(2)))."""
    xf = x.float()
    return (0.5 * xf * (1.0 + torch.erf(xf * (1.0 / math.sqrt(2.0))))).to(x.dtype)


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """cap * tanh(x / cap) (Gemma 2's soft-capping), tanh written with exp:
    tanh(y) = sign(y) (1 - exp(-2|y|)) / (1 + exp(-2|y|))."""
    y = x.float() / cap
    t = torch.exp(-2.0 * y.abs())
    return (cap * (torch.sign(y) * ((1.0 - t) / (1.0 + t)))).to(x.dtype)
