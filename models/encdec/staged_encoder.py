"""An encoder pass that advances in bounded units, so a long input's encoder fits a step's budget.

A bidirectional encoder cannot run over a prefix of its input (every row of layer l attends to
every row of layer l - 1), but it can run layer-major: all rows of layer l, a tile of rows at a
time, then all rows of layer l + 1. Everything in a layer is row-local except attention, and
attention of layer l reads only the K/V of layer l, which are row-local projections of layer
l - 1's output, computed as each row leaves that layer. So one input's encoder is a sequence of
`num_units` units, phase-major: phase 0 embeds a tile and projects layer 0's K/V; phase l + 1
runs layer l for a tile (query, attention over all n keys of layer l, output, feed-forward) and
projects layer l + 1's K/V; the last phase takes the final norm and projects every decoder
layer's cross K/V into a staging buffer (`cross`), which the caller writes into each sequence's
paged cross blocks once the pass is `complete`. A unit costs at most one layer over `TILE` rows.

Same input, same bits, however the units are split over steps or batched with other inputs:
the linears see the rows of every pass of a phase stacked (the batch-invariant GEMM on the CPU,
models/linear_backend.py) and attention runs per pass on its rows padded to a multiple of
`ROW_QUANTUM` (`attend_rows`: the same property of the GEMM libraries, pinned by
tests/models/test_invariant_kernels.py and here by tests/models/test_staged_encoder.py).

Contract: `EncoderPass(token_ids, num_layers)` holds one input's state (`done` units of
`num_units`); `advance(model, work)` runs each pass of `work` [(pass, target units)] up to its
target; `encode_whole(model, token_ids_per_input)` is every pass run through its layers at once
(the final output [sum(n), hidden], no cross K/V). The model gives the `EncoderStack` methods.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import torch

from models.attention import KVCache, write_kv
from models.encdec.attention import attend_rows

TILE = 16  # rows per unit of encoder work (a multiple of ROW_QUANTUM)


class EncoderStack(Protocol):
    """What a model's encoder gives the staged pass (T5 and BART implement it)."""

    encoder_num_layers: int
    encoder_device: torch.device

    def encoder_embed(self, ids: torch.Tensor, positions: torch.Tensor) -> torch.Tensor: ...

    def encoder_qkv(self, layer: int, x: torch.Tensor, parts: str) -> list[torch.Tensor]:
        """Layer `layer`'s projections named by `parts` ("q", "kv") of rows x, [M, H, D] each."""
        ...

    def encoder_bias(self, first: int, q_len: int, k_len: int) -> torch.Tensor | None: ...

    def encoder_scale(self) -> float: ...

    def encoder_finish(self, layer: int, x: torch.Tensor, attended: torch.Tensor) -> torch.Tensor:
        """The layer's output rows from its input rows and attention [M, H * D] (before o)."""
        ...

    def encoder_final(self, x: torch.Tensor) -> torch.Tensor: ...

    def cross_kv(self, encoder_out: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]: ...


class EncoderPass:
    def __init__(self, token_ids: Sequence[int], num_layers: int) -> None:
        self.token_ids = list(token_ids)
        self.length = len(self.token_ids)
        self.num_tiles = -(-self.length // TILE)
        self.num_phases = num_layers + 2  # embed, the layers, cross K/V
        self.num_units = self.num_phases * self.num_tiles
        self.done = 0
        self.x: torch.Tensor | None = None  # [n, hidden]: the current layer's input
        self.kv: list[torch.Tensor] = []  # the current layer's K, V [n, H, D]
        self.next_x: torch.Tensor | None = None  # rows the current phase has finished
        self.next_kv: list[torch.Tensor] = []
        self.cross: list[tuple[torch.Tensor, torch.Tensor]] = []  # per decoder layer [n, H, D]

    @property
    def complete(self) -> bool:
        return self.done == self.num_units

    def units_at(self, position: int, region: int) -> int:
        """Units due once `position` of the `region` slots it is paid by are scheduled."""
        return min(position, region) * self.num_units // region

    def write_cross(self, slots: torch.Tensor, kv_caches: list[KVCache]) -> None:
        """The staged cross K/V into `slots` [n] of every decoder layer's cache."""
        if not self.complete:
            raise RuntimeError("the encoder pass has units left; advance it first")
        write_cross_kv(self.cross, slots, kv_caches)

    def _rows(self, phase: int, target: int) -> tuple[int, int] | None:
        first = max(self.done, phase * self.num_tiles) - phase * self.num_tiles
        last = min(target, (phase + 1) * self.num_tiles) - phase * self.num_tiles
        if first >= last:
            return None
        return first * TILE, min(last * TILE, self.length)

    def _store(self, phase: int, rows: tuple[int, int], x, kv) -> None:
        start, end = rows
        if self.next_x is None:
            self.next_x = _buffer(x, self.length)
            self.next_kv = [_buffer(t, self.length) for t in kv]
        self.next_x[start:end] = x
        for buffer, t in zip(self.next_kv, kv, strict=True):
            buffer[start:end] = t
        self.done = phase * self.num_tiles + -(-end // TILE)
        if end == self.length:  # the phase is whole: its output is the next layer's input
            self.x, self.kv, self.next_x, self.next_kv = self.next_x, self.next_kv, None, []


def advance(model: EncoderStack, work: Sequence[tuple[EncoderPass, int]]) -> None:
    """Runs each pass up to its target unit, phase by phase, the passes of a phase together."""
    work = [(p, min(t, p.num_units)) for p, t in work if t > p.done]
    if not work:
        return
    layers = model.encoder_num_layers
    for phase in range(layers + 2):
        batch = [(p, rows) for p, t in work if (rows := p._rows(phase, t)) is not None]
        if batch:
            if phase == layers + 1:
                _stage_cross(model, batch)
            else:
                _run_phase(model, phase, batch)


def encode_whole(model: EncoderStack, inputs: Sequence[Sequence[int]]) -> torch.Tensor:
    """Every input's encoder output [sum of lengths, hidden], its layers run at once."""
    passes = [EncoderPass(ids, model.encoder_num_layers) for ids in inputs]
    advance(model, [(p, (p.num_phases - 1) * p.num_tiles) for p in passes])
    return model.encoder_final(torch.cat([p.x for p in passes]))


def _run_phase(model: EncoderStack, phase: int, batch) -> None:
    """Phase 0: embed; phase l + 1: layer l. Both end with the next layer's K/V."""
    if phase == 0:
        device = model.encoder_device
        ids = [t for p, (a, b) in batch for t in p.token_ids[a:b]]
        positions = [i for _, (a, b) in batch for i in range(a, b)]
        x = model.encoder_embed(
            torch.tensor(ids, dtype=torch.int64).to(device),
            torch.tensor(positions, dtype=torch.int64).to(device),
        )
    else:
        layer = phase - 1
        inputs = torch.cat([p.x[a:b] for p, (a, b) in batch])  # [M, hidden]
        (q,) = model.encoder_qkv(layer, inputs, "q")
        scale, attended, start = model.encoder_scale(), [], 0
        for p, (a, b) in batch:
            bias = model.encoder_bias(a, b - a, p.length)
            k, v = p.kv
            attended.append(attend_rows(q[start : start + b - a], k, v, scale, bias))
            start += b - a
        x = model.encoder_finish(layer, inputs, torch.cat(attended))
    kv = model.encoder_qkv(phase, x, "kv") if phase < model.encoder_num_layers else []
    start = 0
    for p, (a, b) in batch:
        p._store(phase, (a, b), x[start : start + b - a], [t[start : start + b - a] for t in kv])
        start += b - a


def _stage_cross(model: EncoderStack, batch) -> None:
    phase = model.encoder_num_layers + 1
    out = model.encoder_final(torch.cat([p.x[a:b] for p, (a, b) in batch]))
    kv = model.cross_kv(out)  # per decoder layer (k, v) [M, H, D]
    start = 0
    for p, (a, b) in batch:
        if not p.cross:
            p.cross = [(_buffer(k, p.length), _buffer(v, p.length)) for k, v in kv]
        for (ck, cv), (k, v) in zip(p.cross, kv, strict=True):
            ck[a:b], cv[a:b] = k[start : start + b - a], v[start : start + b - a]
        start += b - a
        p.done = phase * p.num_tiles + -(-b // TILE)
        if p.complete:
            p.x, p.kv = None, []


class WholeEncoderMethods:
    """The encoder-decoder model's `encode` / `write_cross_kv` on its `EncoderStack` methods
    (T5 and BART mix it in)."""

    def encode(
        self: EncoderStack,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        seq_lens: Sequence[int],
    ) -> torch.Tensor:
        return encode_whole(self, split_inputs(input_ids, seq_lens))

    def write_cross_kv(
        self: EncoderStack, encoder_out: torch.Tensor, slots: torch.Tensor, kv_caches: list[KVCache]
    ) -> None:
        write_cross_kv(self.cross_kv(encoder_out), slots, kv_caches)


def split_inputs(input_ids: torch.Tensor, seq_lens: Sequence[int]) -> list[list[int]]:
    """A flat batch of whole inputs [T] back into one id list per input."""
    return [part.tolist() for part in input_ids.cpu().split(list(seq_lens))]


def write_cross_kv(
    kv: Sequence[tuple[torch.Tensor, torch.Tensor]], slots: torch.Tensor, kv_caches: list[KVCache]
) -> None:
    """Cross K/V [n, H, D] per decoder layer into `slots` [n] of that layer's cache."""
    for (k, v), cache in zip(kv, kv_caches, strict=True):
        write_kv(cache, k, v, slots)


def _buffer(like: torch.Tensor, rows: int) -> torch.Tensor:
    return like.new_empty(rows, *like.shape[1:])
