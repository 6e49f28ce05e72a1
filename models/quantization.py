"""Opt-in weight-only int8 quantisation: every nn.Linear becomes an Int8Linear holding
per-output-channel symmetric int8 weights and one scale per row.

Why: batch-1 decode is bound by streaming weights from memory; int8 halves the bytes of bf16.
torch ships a CPU kernel for int8 weights with bf16/fp32 activations
(`aten._weight_int8pack_mm`); elsewhere we fall back to dequantise-then-matmul, the readable
reference the kernel is tested against.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class Int8Linear(nn.Module):
    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach().float()  # [out, in]
        scale = weight.abs().amax(dim=1).clamp(min=1e-8) / 127.0  # [out]
        self.register_buffer(
            "weight_int8", torch.round(weight / scale[:, None]).clamp(-127, 127).to(torch.int8)
        )
        self.register_buffer("scale", scale.to(linear.weight.dtype))
        self.bias = (
            None
            if linear.bias is None
            else nn.Parameter(linear.bias.detach().clone(), requires_grad=False)
        )
        self.in_features, self.out_features = linear.in_features, linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        x2 = x.reshape(-1, shape[-1])  # [M, in]
        if x2.device.type == "cpu":
            y = torch.ops.aten._weight_int8pack_mm(x2, self.weight_int8, self.scale)
        else:
            y = self.reference(x2)
        if self.bias is not None:
            y = y + self.bias
        return y.reshape(*shape[:-1], self.out_features)

    def reference(self, x: torch.Tensor) -> torch.Tensor:
        """Dequantise, then an ordinary matmul: the eager reference of the fused kernel."""
        weight = self.weight_int8.to(x.dtype) * self.scale[:, None].to(x.dtype)
        return F.linear(x, weight)


def quantize_int8_weight_only(model: nn.Module) -> nn.Module:
    """Replaces every nn.Linear (the LM head included) in place; returns the model."""
    for module in list(model.modules()):
        for child_name, child in list(module.named_children()):
            if isinstance(child, nn.Linear):
                setattr(module, child_name, Int8Linear(child))
    return model
