"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

Contract: `DecodeGraphs(path, buffers, max_num_seqs, new_graph)` wraps a forward path
(models/forward_path.py) whose `graph_support` is DECODE_ONLY, over the persistent buffers of
its attention backend (`path.attention.decode_buffers(...)`, models/decode_buffers.py).
- `capture()`: for every bucket (engine/cuda_graphs/buckets.py), largest first so the
  smaller ones reuse its memory pool, fills the buffers with padding rows
  (`buffers.build_for_capture(b)`: capture writes K/V into the scratch block alone) and
  records `logits(hidden(ids, positions, meta))` over the bucket's views: the whole decode
  forward and the LM head. Sampling stays outside the graph (engine/sampling: per-row
  parameters, generators and grammars decide its work on the host) and reads the graph's
  logits; the step's one device-to-host copy is the sampler's `fetch`.
- `run(rows) -> [num_rows, vocab] float32 | None`: writes the step into the buffers
  (`buffers.build_for_replay`: padding to the bucket, one host-to-device copy) and replays
  that bucket's graph. None when no bucket holds the step or a block table is wider than the
  buffers (the caller runs it eagerly).
- LoRA adapters (`adapters=True`, a model with a LoRA bank, models/lora): every graph reads
  each row's adapter slot from one more persistent buffer, `[max rows]` int64 (-1: the base
  model, padding rows included), set as the bucket step's `meta.lora_rows` at capture and
  written at each replay, so steps mixing adapters replay like any other (the kernels read the
  slot per row on the device: no Python branch per row). Graphs captured without it send
  steps with adapter rows eager (None). The tensor is a view of the graph's output buffer:
  valid until the next `run`, which is all a step needs.
- `new_graph(pool)` makes one recorder: `CudaGraph` on CUDA; `EagerReplay` elsewhere (CPU
  tests): "replay" re-runs the recorded function over the same buffers, which is what a
  graph does when everything it reads lives in them, so a function that kept a host value
  from capture time goes stale there as it would in a real graph.
Mixed steps (any prefill chunk) and steps asking for prompt logprobs never come here.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import torch

from engine.cuda_graphs.buckets import DecodeRows, bucket_for, graph_buckets
from models.attention_backend import GraphSupport
from models.decode_buffers import DecodeBuffers, DecodeStep
from models.forward_path import ForwardPath

log = logging.getLogger("tgserve.engine")


@dataclass(frozen=True)
class GraphSettings:
    """What sizes the graphs: the largest batch and the longest context a row can have."""

    max_num_seqs: int
    max_model_len: int


def graphs_supported(path: ForwardPath, device: torch.device) -> bool:
    """CUDA graphs need a CUDA device and a path whose decode steps can be captured."""
    return device.type == "cuda" and path.graph_support is GraphSupport.DECODE_ONLY


class GraphRecorder(Protocol):
    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor: ...

    def replay(self) -> None: ...

    def pool(self) -> object: ...


class CudaGraph:
    """One `torch.cuda.CUDAGraph`: two warm-up runs on a side stream (allocator, kernel
    selection, Triton compilation), then the capture, in `pool` when given (shared)."""

    def __init__(self, device: torch.device, pool: object = None) -> None:
        self.device = device
        self._pool = pool
        self._graph = torch.cuda.CUDAGraph()

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        main = torch.cuda.current_stream(self.device)
        side = torch.cuda.Stream(self.device)
        side.wait_stream(main)
        with torch.cuda.stream(side):
            for _ in range(2):
                fn()
        main.wait_stream(side)
        with torch.cuda.graph(self._graph, pool=self._pool):
            out = fn()
        return out

    def replay(self) -> None:
        self._graph.replay()

    def pool(self) -> object:
        return self._graph.pool()


class EagerReplay:
    """Off CUDA: `replay` re-runs the recorded function and writes into the output it gave."""

    def __init__(self, pool: object = None) -> None:
        self._fn: Callable[[], torch.Tensor] | None = None
        self._out: torch.Tensor | None = None

    def capture(self, fn: Callable[[], torch.Tensor]) -> torch.Tensor:
        self._fn, self._out = fn, fn()
        return self._out

    def replay(self) -> None:
        self._out.copy_(self._fn())

    def pool(self) -> object:
        return None


def recorder_for(device: torch.device) -> Callable[[object], GraphRecorder]:
    if device.type == "cuda":
        return lambda pool: CudaGraph(device, pool)
    return EagerReplay


class DecodeGraphs:
    def __init__(
        self,
        path: ForwardPath,
        buffers: DecodeBuffers,
        max_num_seqs: int,
        new_graph: Callable[[object], GraphRecorder],
        adapters: bool = False,
    ) -> None:
        if path.graph_support is not GraphSupport.DECODE_ONLY:
            raise ValueError(f"{path.description} cannot be captured")
        self.path = path
        self.buffers = buffers
        self.buckets = graph_buckets(max_num_seqs)
        self._new_graph = new_graph
        self._graphs: dict[int, GraphRecorder] = {}
        self._outputs: dict[int, torch.Tensor] = {}  # bucket -> [b, vocab] graph output
        self._lora_rows = (  # [max rows] int64: each row's adapter slot, -1 the base model
            torch.full((buffers.max_rows,), -1, dtype=torch.int64, device=buffers.device)
            if adapters
            else None
        )

    @property
    def captured(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))

    def _forward(self, step: DecodeStep) -> torch.Tensor:
        """What a graph records: the decode forward and LM head over a bucket's views."""
        hidden = self.path.hidden(step.input_ids, step.positions, step.meta)
        return self.path.logits(hidden)  # [bucket, vocab] float32

    @torch.inference_mode()
    def capture(self) -> None:
        pool = None
        for bucket in sorted(self.buckets, reverse=True):
            step = self.buffers.build_for_capture(bucket)
            if self._lora_rows is not None:  # the graph reads the slots from the buffer
                step.meta.lora_rows = self._lora_rows[:bucket]
            graph = self._new_graph(pool)
            self._outputs[bucket] = graph.capture(lambda step=step: self._forward(step))
            pool = graph.pool()
            self._graphs[bucket] = graph
        if self.buffers.device.type == "cuda":
            torch.cuda.synchronize(self.buffers.device)
            log.info("captured decode CUDA graphs for batch sizes %s", self.captured)

    def run(self, rows: DecodeRows) -> torch.Tensor | None:
        bucket = bucket_for(rows.num_rows, self.buckets)
        if bucket is None or bucket not in self._graphs:
            return None
        if rows.adapter_slots is not None and self._lora_rows is None:
            return None  # captured without adapters
        step = self.buffers.build_for_replay(
            rows.token_ids, rows.positions, rows.block_tables, bucket
        )
        if step is None:
            return None
        if self._lora_rows is not None:
            self._write_slots(rows, bucket)
        self._graphs[bucket].replay()
        return self._outputs[bucket][: rows.num_rows]

    def _write_slots(self, rows: DecodeRows, bucket: int) -> None:
        slots = torch.full((bucket,), -1, dtype=torch.int64)  # padding rows: the base model
        if rows.adapter_slots is not None:
            slots[: rows.num_rows] = torch.tensor(rows.adapter_slots, dtype=torch.int64)
        if self.buffers.device.type == "cuda":
            slots = slots.pin_memory()
        self._lora_rows[:bucket].copy_(slots, non_blocking=True)
