"""A minimal driver that runs one of our models over the paged cache for several sequences,
with shuffled (non-contiguous) block ids, for tests that compare against transformers."""

from __future__ import annotations

import random

import torch

from models import allocate_kv_cache
from models.attention import AttentionMetadata


class PagedDriver:
    def __init__(
        self,
        model,
        num_blocks: int = 128,
        block_size: int = 4,
        seed: int = 0,
        kv_cache_dtype: str = "auto",
    ) -> None:
        config = model.config
        self.model = model
        self.block_size = block_size
        param = next(model.parameters())
        self.device = param.device  # the model's: cpu, or the TGSERVE_TEST_DEVICE GPU
        self.kv = allocate_kv_cache(
            config, num_blocks, block_size, param.dtype, self.device, None, kv_cache_dtype
        )
        self.free = list(range(num_blocks))
        random.Random(seed).shuffle(self.free)
        self.tables: list[list[int]] = []
        self.lens: list[int] = []

    def add_sequence(self) -> int:
        self.tables.append([])
        self.lens.append(0)
        return len(self.tables) - 1

    def step(
        self,
        new_tokens: dict[int, list[int]],
        fused=None,
        adapters: dict[int, int] | None = None,
    ) -> dict[int, torch.Tensor]:
        """Feeds new tokens for some sequences in ONE forward; returns logits [n, V] per seq.
        With `fused` (a FusedDecoder or a forward path over self.kv), the step runs through it
        (a path's metadata built by its attention backend). `adapters`: a sequence's LoRA slot
        (models/lora), put on every one of its rows (-1, the base model, for the others)."""
        ids, positions, tables, seq_lens, query_lens = [], [], [], [], []
        for seq, toks in new_tokens.items():
            start = self.lens[seq]
            end = start + len(toks)
            while len(self.tables[seq]) * self.block_size < end:
                self.tables[seq].append(self.free.pop())
            self.lens[seq] = end
            ids += toks
            positions += list(range(start, end))
            tables.append(self.tables[seq])
            seq_lens.append(end)
            query_lens.append(len(toks))
        backend = getattr(fused, "attention", None)  # a forward path builds its own metadata
        if backend is not None:
            meta = backend.build(tables, seq_lens, query_lens)
        else:
            meta = AttentionMetadata.build(
                tables,
                seq_lens,
                query_lens,
                self.block_size,
                self.device,
                sliding_window=self.model.config.sliding_window,
            )
        if adapters is not None:
            slots = [adapters.get(seq, -1) for seq, toks in new_tokens.items() for _ in toks]
            meta.lora_rows = torch.tensor(slots, dtype=torch.int64, device=self.device)
        ids_t = torch.tensor(ids, device=self.device)
        positions_t = torch.tensor(positions, device=self.device)
        with torch.inference_mode():
            if fused is not None:
                hidden = fused.hidden(ids_t, positions_t, meta)
                logits = fused.logits(hidden)
            else:
                hidden = self.model(ids_t, positions_t, meta, self.kv)
                logits = self.model.compute_logits(hidden)
        out, row = {}, 0
        for seq, toks in new_tokens.items():
            out[seq] = logits[row : row + len(toks)]
            row += len(toks)
        return out
