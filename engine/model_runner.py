"""ModelRunner: turns one step's scheduled chunks into tensors, runs ONE forward over all of
them (prefill chunks and decodes mixed), and returns logits only for the rows that sample.

Contract: `execute(chunks, block_copies)` where each chunk has `.seq` (with `token_ids` and
`block_table`), `.start` (tokens already in the cache), `.num_new_tokens`, `.seq_len` (start +
num_new_tokens) and `.sample`.
Returns `[num_sampling_chunks, vocab]` float32 logits in chunk order, plus, when asked,
the logits of every new row (for prompt logprobs). The KV cache is owned here; how the
forward runs (C++ step, PyTorch layers with C++ attention, plain PyTorch) is chosen once, in
models/forward_path.py, and the runner only calls the path it returns.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import torch

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
    ) -> None:
        self.model = model
        self.config = config
        self.block_size = block_size
        self.device = device
        # Embedding tables padded past the tokenizer (Qwen2: 151936 rows, 151665 tokens) hold
        # ids nothing can decode: the sampler only ever sees the first `sampleable_vocab`.
        self.sampleable_vocab = sampleable_vocab if sampleable_vocab and sampleable_vocab < config.vocab_size else None
        self.kv_caches = allocate_kv_cache(config, num_blocks, block_size, dtype, device)
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
        if block_copies:
            self._copy_blocks(block_copies)
        ids: list[int] = []
        positions: list[int] = []
        tables, seq_lens, query_lens = [], [], []
        sample_rows: list[int] = []
        row_starts: list[int] = []
        for chunk in chunks:
            start, end = chunk.start, chunk.seq_len
            row_starts.append(len(ids))
            ids.extend(chunk.seq.token_ids[start:end])
            positions.extend(range(start, end))
            tables.append(chunk.seq.block_table)
            seq_lens.append(end)
            query_lens.append(chunk.num_new_tokens)
            if chunk.sample:
                sample_rows.append(len(ids) - 1)
        meta = AttentionMetadata.build(
            tables,
            seq_lens,
            query_lens,
            self.block_size,
            self.device,
            self.config.sliding_window,
            self.forward_path.attention_kernel,
        )
        hidden = self.forward_path.hidden(  # [T, hidden]
            torch.tensor(ids, device=self.device), torch.tensor(positions, device=self.device), meta
        )
        rows = hidden
        if len(sample_rows) != len(ids):
            rows = hidden[torch.tensor(sample_rows, dtype=torch.long, device=self.device)]
        sampling = self._sampleable(self.forward_path.logits(rows))
        # Prompt logprobs: the model's own LM head over every new row, whatever the path.
        all_rows = {
            i: self.model.compute_logits(
                hidden[row_starts[i] : row_starts[i] + chunks[i].num_new_tokens]
            )
            for i in full_logits_for
        }
        return StepLogits(sampling=sampling, all_rows=all_rows)

    def _sampleable(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.sampleable_vocab is None else logits[:, : self.sampleable_vocab]

    def _copy_blocks(self, copies: Sequence[tuple[int, int]]) -> None:
        """Copy-on-write: a sharer about to write into a shared block got a fresh copy of it."""
        src = torch.tensor([s for s, _ in copies], device=self.device)
        dst = torch.tensor([d for _, d in copies], device=self.device)
        for k_cache, v_cache in self.kv_caches:
            k_cache.index_copy_(0, dst, k_cache[src])
            v_cache.index_copy_(0, dst, v_cache[src])

