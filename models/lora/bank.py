"""LoraBank: a fixed number of adapter slots held on the model's device, the stacks of every
adapted projection, and the step's per-row slot indices.

Contract: `LoraBank(config, slots, max_rank, dtype, device)` allocates, for each layer, one
`LoraStack` per fused projection (qkv, o, gate_up, down: models/lora/stack.py) with `slots`
slots of rank up to `max_rank`; `attach(model)` points the model's projections at them
(models/llama.py's layers hold `qkv_lora`, `o_lora`, `gate_up_lora`, `down_lora`) and sets
`model.lora_bank`. `write(slot, adapter)` copies an adapter's weights into a slot (cast to the
model dtype; the slot is cleared first, modules the adapter leaves out stay zero) and
`clear(slot)` zeroes it. Under tensor parallel (`layout`: the rank's ShardLayout) the stacks
hold the rank's part (models/lora/shard.py), `write` cuts each adapter as its base projection
is cut, and the row-parallel o / down projections add their partial deltas before their
all-reduce (`RowParallelLinear.lora`). `clear(slot)` zeroes a slot: the bank is the only copy of an adapter the forward reads, whatever
the number of requests using it (`nbytes` is fixed at construction). `begin_step(rows)`:
the step's [T] int64 slot per new token (-1: the base model; None: every row is the base),
read by every projection of that forward (the model's forward calls it with
`AttentionMetadata.lora_rows`, the step metadata the runner built).
"""

from __future__ import annotations

import torch
from torch import nn

from models.config import ModelConfig
from models.lora.adapter import TARGET_MODULES, LoraAdapter, LoraRefused, module_shape
from models.lora.shard import LoraShard
from models.lora.stack import LoraStack
from models.parallel.layers import RowParallelLinear
from models.parallel.layout import ShardLayout

# Fused projection -> its slices' checkpoint module names, in output order.
PROJECTIONS: dict[str, tuple[str, ...]] = {
    "qkv": ("q_proj", "k_proj", "v_proj"),
    "o": ("o_proj",),
    "gate_up": ("gate_proj", "up_proj"),
    "down": ("down_proj",),
}


class StepRows:
    """The current step's [T] slot per row, shared by the stacks of one bank."""

    rows: torch.Tensor | None = None


class LoraBank:
    def __init__(
        self,
        config: ModelConfig,
        slots: int,
        max_rank: int,
        dtype: torch.dtype,
        device: torch.device | str,
        layout: ShardLayout | None = None,
    ) -> None:
        if slots < 1 or max_rank < 1:
            raise ValueError("a LoRA bank needs at least one slot and a max rank >= 1")
        self.config, self.slots, self.max_rank = config, slots, max_rank
        self.step = StepRows()
        self.shard = None if layout is None else LoraShard(layout, config.head_dim)
        self.layers: list[dict[str, LoraStack]] = []
        for _ in range(config.num_layers):
            stacks = {}
            for proj, names in PROJECTIONS.items():
                shapes = [self._shape(n) for n in names]
                outs = [n for _, n in shapes]
                stacks[proj] = LoraStack(slots, max_rank, shapes[0][0], outs, dtype, device)
            self.layers.append(stacks)

    def _shape(self, module: str) -> tuple[int, int]:
        k, n = module_shape(self.config, module)
        return (k, n) if self.shard is None else self.shard.local_shape(module, k, n)

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for stacks in self.layers for s in stacks.values())

    def stacks(self) -> list[LoraStack]:
        return [s for stacks in self.layers for s in stacks.values()]

    def use_kernel(self, kernel) -> None:
        """Routes every stack's CPU rows through the C++ kernel (models/cpu_kernels/lora.cpp)."""
        for stack in self.stacks():
            stack.kernel = kernel

    def attach(self, model: nn.Module) -> None:
        for layer, stacks in zip(model.model.layers, self.layers, strict=True):
            attn, mlp = layer.self_attn, layer.mlp
            attn.qkv_lora = _Applied(stacks["qkv"], self.step)
            mlp.gate_up_lora = _Applied(stacks["gate_up"], self.step)
            attn.o_lora = _before_reduce(attn.o_proj, _Applied(stacks["o"], self.step))
            mlp.down_lora = _before_reduce(mlp.down_proj, _Applied(stacks["down"], self.step))
        model.lora_bank = self

    def check(self, adapter: LoraAdapter) -> None:
        """LoraRefused when the adapter does not fit the model or the bank's max rank."""
        adapter.check_fits(self.config)
        if adapter.max_rank > self.max_rank:
            raise LoraRefused(
                f"adapter {adapter.name!r} has rank {adapter.max_rank}, above --max-lora-rank "
                f"{self.max_rank}"
            )

    def write(self, slot: int, adapter: LoraAdapter) -> None:
        self.check(adapter)
        self.clear(slot)
        for (layer, module), lora in adapter.modules.items():
            proj, piece = TARGET_MODULES[module]
            a, b = (
                (lora.a, lora.b) if self.shard is None else self.shard.cut(module, lora.a, lora.b)
            )
            self.layers[layer][proj].put(slot, piece, a, b, lora.scale)

    def clear(self, slot: int) -> None:
        if not 0 <= slot < self.slots:
            raise ValueError(f"slot {slot} is outside the bank's {self.slots} slots")
        for stack in self.stacks():
            stack.clear(slot)

    def begin_step(self, rows: torch.Tensor | None) -> None:
        self.step.rows = rows


def _before_reduce(projection: nn.Module, applied: _Applied) -> _Applied | None:
    """A row-parallel projection adds the rank's partial delta to its partial product, before
    its all-reduce (then the layer adds nothing after it); any other adds after."""
    if isinstance(projection, RowParallelLinear):
        projection.lora = applied
        return None
    return applied


class _Applied:
    """A projection's view of its stack and the bank's step rows: `(x, y) -> y + LoRA`."""

    def __init__(self, stack: LoraStack, step: StepRows) -> None:
        self.stack, self.step = stack, step

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.stack.add(x, y, self.step.rows)
