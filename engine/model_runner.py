"""ModelRunner: turns one step's scheduled chunks into tensors, runs ONE forward over all of
them (prefill chunks and decodes mixed), and returns logits only for the rows that sample.

Contract: `execute(chunks, block_copies)` where each chunk has `.seq` (with `token_ids` and
`block_table`), `.start` (tokens already in the cache), `.num_new_tokens`, `.seq_len` (start +
num_new_tokens) and `.sample`.
Returns `[num_sampling_chunks, vocab]` float32 logits in chunk order, plus, when asked,
the logits of every new row (for prompt logprobs). Under tensor parallel, rank 0's `execute`
broadcasts the step's inputs (engine/parallel/) and every rank's `run` does the same forward;
a failed step is then a `FatalEngineError` (the ranks are out of step). The KV cache is owned here; how the
forward runs (C++ step, PyTorch layers with C++ attention, plain PyTorch) is chosen once, in
models/forward_path.py, and the runner only calls the path it returns.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from engine.api import FatalEngineError
from engine.parallel.rank import ParallelRank
from engine.parallel.step_inputs import StepInputs
from models import allocate_kv_cache
from models.attention import AttentionMetadata
from models.config import ModelConfig
from models.forward_path import select_forward_path


@dataclass(frozen=True)
class StepLogits:
    sampling: torch.Tensor  # [num_sampling_chunks, vocab] float32, in chunk order
    all_rows: dict[int, torch.Tensor]  # chunk index -> [num_new_tokens, vocab] when asked


class ModelRunner:
    def __init__(
        self,
        model: torch.nn.Module,
        config: ModelConfig,
        num_blocks: int,
        block_size: int,
        dtype: torch.dtype,
        device: torch.device,
        cpu_kernels: bool = False,
        sampleable_vocab: int | None = None,
        parallel: ParallelRank | None = None,
    ) -> None:
        self.model = model
        self.config = config
        self.block_size = block_size
        self.device = device
        # Embedding tables padded past the tokenizer (Qwen2: 151936 rows, 151665 tokens) hold
        # ids nothing can decode: the sampler only ever sees the first `sampleable_vocab`.
        self.sampleable_vocab = (
            sampleable_vocab if sampleable_vocab and sampleable_vocab < config.vocab_size else None
        )
        # Tensor parallel: this rank's shard of the model and the KV heads it holds.
        self.parallel = parallel
        kv_heads = None if parallel is None else parallel.layout.num_kv_heads
        self.kv_caches = allocate_kv_cache(config, num_blocks, block_size, dtype, device, kv_heads)
        # cpu_kernels: tgserve's C++ CPU kernels are wanted; the seam says what can run.
        self.forward_path = select_forward_path(
            model, self.kv_caches, device, cpu_kernels=cpu_kernels
        )
        # True when the C++ kernels serve this runner (read by the benchmark's labels).
        self.cpu_kernels = self.forward_path.attention_kernel

    @torch.inference_mode()
    def execute(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]] = (),
        full_logits_for: frozenset[int] = frozenset(),
    ) -> StepLogits:
        step = StepInputs.from_chunks(chunks, block_copies, full_logits_for)
        if self.parallel is None:
            return self.run(step)
        try:  # rank 0: every rank runs the same step, so it goes out first
            self.parallel.channel.send(step)
            return self.run(step)
        except Exception as exc:  # a rank may have run collectives the others did not
            raise FatalEngineError(
                f"a tensor-parallel step failed ({type(exc).__name__}: {exc}); "
                "the ranks are out of step"
            ) from exc

    @torch.inference_mode()
    def run(self, step: StepInputs) -> StepLogits:
        """One forward over a step's inputs (every rank of a tensor-parallel group runs it)."""
        if step.block_copies:
            self._copy_blocks(step.block_copies)
        meta = AttentionMetadata.build(
            [list(t) for t in step.tables],
            list(step.seq_lens),
            list(step.query_lens),
            self.block_size,
            self.device,
            self.config.sliding_window,
            self.forward_path.attention_kernel,
        )
        ids = torch.tensor(step.ids, dtype=torch.long, device=self.device)
        positions = torch.tensor(step.positions, dtype=torch.long, device=self.device)
        hidden = self.forward_path.hidden(ids, positions, meta)  # [T, hidden]
        rows = hidden
        if len(step.sample_rows) != len(step.ids):
            rows = hidden[torch.tensor(step.sample_rows, dtype=torch.long, device=self.device)]
        sampling = self._sampleable(self.forward_path.logits(rows))
        # Prompt logprobs: the model's own LM head over every new row, whatever the path.
        starts = step.row_starts
        all_rows = {
            i: self.model.compute_logits(hidden[starts[i] : starts[i] + step.query_lens[i]])
            for i in step.full_logits_for
        }
        return StepLogits(sampling=sampling, all_rows=all_rows)

    def watch_failures(self, on_failure: Callable[[str], None]) -> None:
        """Rank 0 of a tensor-parallel group: `on_failure(reason)` once when another rank's
        process exits on its own (nothing to watch otherwise)."""
        if self.parallel is not None and self.parallel.workers is not None:
            self.parallel.workers.watch(on_failure)

    def close(self) -> None:
        """Rank 0 of a tensor-parallel group: tell the other ranks to stop, wait for their
        processes (terminated if they do not exit), leave the group. No-op otherwise."""
        if self.parallel is None or self.parallel.workers is None:
            return
        # A rank may be gone already: the processes are stopped below anyway.
        with contextlib.suppress(Exception):
            self.parallel.channel.send_stop()
        self.parallel.workers.stop(timeout=10.0)
        self.parallel.group.close()

    def _sampleable(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.sampleable_vocab is None else logits[:, : self.sampleable_vocab]

    def _copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write: a sharer about to write into a shared block got a fresh copy of it."""
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        for k_cache, v_cache in self.kv_caches:
            k_cache.index_copy_(0, dst, k_cache[src])
            v_cache.index_copy_(0, dst, v_cache[src])
