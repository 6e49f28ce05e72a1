"""WeightLoader: copies checkpoint tensors (Hugging Face names) into a model's parameters.

Contract: the model declares a short name map — fragments of HF names that land in a row
slice of a fused parameter, tensors to transpose (GPT-2's Conv1D), names to ignore — then
`load(weights)` copies every tensor, checks every shape, and raises `ValueError` naming the
tensor when a shape mismatches, a tensor is unexpected, or a parameter was never filled.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class _Fusion:
    source: str  # fragment of the checkpoint name, e.g. "self_attn.q_proj"
    target: str  # fragment of our parameter name, e.g. "self_attn.qkv_proj"
    offset: int  # first row (dim 0) inside the target
    rows: int


class WeightLoader:
    def __init__(self, model: nn.Module) -> None:
        self.params = dict(model.named_parameters())  # tied weights appear once
        self.fusions: list[_Fusion] = []
        self.transposed: list[str] = []
        self.ignored: set[str] = set()
        self.ignored_suffixes: list[str] = []

    def fuse(self, source: str, target: str, offset: int, rows: int) -> None:
        self.fusions.append(_Fusion(source, target, offset, rows))

    def transpose(self, fragment: str) -> None:
        self.transposed.append(fragment)

    def ignore(self, name: str) -> None:
        self.ignored.add(name)

    def ignore_suffix(self, suffix: str) -> None:
        self.ignored_suffixes.append(suffix)

    def load(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        filled: dict[str, int] = {}  # parameter name -> rows filled
        for name, tensor in weights:
            if name in self.ignored or any(name.endswith(s) for s in self.ignored_suffixes):
                continue
            target, rows = self._place(name)
            if target not in self.params:
                raise ValueError(f"checkpoint tensor {name!r} has no place in the model")
            if any(f"{frag}." in target for frag in self.transposed) and tensor.dim() == 2:
                tensor = tensor.t()
            param = self.params[target]
            dest = param.data if rows is None else param.data[rows[0] : rows[0] + rows[1]]
            if tuple(dest.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"checkpoint tensor {name!r} has shape {tuple(tensor.shape)}, "
                    f"the model expects {tuple(dest.shape)}"
                )
            with torch.no_grad():
                dest.copy_(tensor)
            filled[target] = filled.get(target, 0) + (dest.shape[0] if dest.dim() else 1)
        missing = [
            n for n, p in self.params.items() if filled.get(n, 0) < (p.shape[0] if p.dim() else 1)
        ]
        if missing:
            shown = ", ".join(missing[:5]) + (" ..." if len(missing) > 5 else "")
            raise ValueError(f"checkpoint is missing {len(missing)} tensor(s): {shown}")

    def _place(self, name: str) -> tuple[str, tuple[int, int] | None]:
        for f in self.fusions:
            marker = f".{f.source}."
            if marker in name:
                return name.replace(marker, f".{f.target}."), (f.offset, f.rows)
        return name, None
