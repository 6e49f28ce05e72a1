"""Decode steps replayed from CUDA graphs, one graph per batch-size bucket.

Contract: `DecodeGraphs(path, inputs, settings, block_size, sliding_window, scratch_block)`
wraps a forward path (models/forward_path.py) for decode-only steps.
- `capture()` (CUDA only): for every bucket, largest first so the smaller ones reuse its
  memory pool, runs the step twice eagerly on a side stream (warm-up: allocator, kernel
  selection) and captures `logits(hidden(ids, positions, meta))` over the first b rows of the
  static inputs into one `torch.cuda.CUDAGraph`. The buffers then hold padding rows only, so
  capture writes K/V into the scratch block alone.
- `run(rows) -> [num_rows, vocab] float32 | None`: pads the step to its bucket, fills the
  static inputs and replays that bucket's graph (or, when nothing was captured, runs the same
  function eagerly over the same buffers: the CPU path of the tests). None when no bucket
  holds the step, or a block table is wider than the buffers (the caller runs it eagerly). The returned tensor is a view of the graph's
  output buffer: valid until the next `run`, which is all a step needs.
Padding (engine/cuda_graphs/buckets.py) writes only into the scratch block, which the runner
allocates past the block manager's blocks; each row's result depends on its own inputs only, so
real rows come out as in the eager step (tests/engine/cuda_graphs/ checks both on CPU).
Mixed steps (any prefill chunk) and steps asking for prompt logprobs never come here.
The path must declare `graph_capturable = True`: its forward reads per-row lengths and block
tables from the metadata's tensors only (no host list, no host sync, no data-dependent shape).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

import torch

from engine.cuda_graphs.buckets import DecodeRows, bucket_for, graph_buckets, pad_decode_rows
from engine.cuda_graphs.static_inputs import StaticDecodeInputs

log = logging.getLogger("tgserve.engine")


@dataclass(frozen=True)
class GraphSettings:
    """What sizes the graphs: the largest batch and the longest context a row can have."""

    max_num_seqs: int
    max_model_len: int


def graphs_supported(path: object, device: torch.device) -> bool:
    """Graphs need a CUDA device and a forward path that declares itself capturable."""
    return device.type == "cuda" and bool(getattr(path, "graph_capturable", False))


class DecodeGraphs:
    def __init__(
        self,
        path,
        inputs: StaticDecodeInputs,
        settings: GraphSettings,
        block_size: int,
        sliding_window: int | None,
        scratch_block: int,
    ) -> None:
        self.path = path
        self.inputs = inputs
        self.settings = settings
        self.block_size = block_size
        self.sliding_window = sliding_window
        self.scratch_block = scratch_block
        self.buckets = graph_buckets(settings.max_num_seqs)
        self._graphs: dict[int, torch.cuda.CUDAGraph] = {}
        self._outputs: dict[int, torch.Tensor] = {}  # bucket -> [b, vocab] graph output

    @property
    def captured(self) -> tuple[int, ...]:
        return tuple(sorted(self._graphs))

    def _step(self, bucket: int, seq_lens_list: list[int]) -> torch.Tensor:
        """The function a graph records: the forward over the first `bucket` static rows."""
        meta = self.inputs.metadata(
            bucket,
            self.block_size,
            self.sliding_window,
            self.path.attention_kernel,
            seq_lens_list,
        )
        inputs = self.inputs
        hidden = self.path.hidden(inputs.input_ids[:bucket], inputs.positions[:bucket], meta)
        return self.path.logits(hidden)  # [bucket, vocab] float32

    def _padding_only(self, bucket: int) -> None:
        empty = DecodeRows([], [], [], [], [])
        self.inputs.fill(pad_decode_rows(empty, bucket, self.scratch_block, self.block_size))

    @torch.inference_mode()
    def capture(self) -> None:
        worst = [self.settings.max_model_len] * max(self.buckets)
        pool = None
        side = torch.cuda.Stream(self.inputs.device)
        for bucket in sorted(self.buckets, reverse=True):
            self._padding_only(bucket)
            side.wait_stream(torch.cuda.current_stream(self.inputs.device))
            with torch.cuda.stream(side):
                for _ in range(2):
                    self._step(bucket, worst[:bucket])
            torch.cuda.current_stream(self.inputs.device).wait_stream(side)
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph, pool=pool):
                self._outputs[bucket] = self._step(bucket, worst[:bucket])
            pool = graph.pool()
            self._graphs[bucket] = graph
        torch.cuda.synchronize(self.inputs.device)
        log.info("captured decode CUDA graphs for batch sizes %s", self.captured)

    def run(self, rows: DecodeRows) -> torch.Tensor | None:
        bucket = bucket_for(rows.num_rows, self.buckets)
        width = self.inputs.max_blocks_per_seq
        if bucket is None or any(len(table) > width for table in rows.block_tables):
            return None
        padded = pad_decode_rows(rows, bucket, self.scratch_block, self.block_size)
        self.inputs.fill(padded)
        graph = self._graphs.get(bucket)
        if graph is None:  # nothing captured (CPU): the same step, eagerly
            return self._step(bucket, padded.seq_lens)[: rows.num_rows]
        graph.replay()
        return self._outputs[bucket][: rows.num_rows]
