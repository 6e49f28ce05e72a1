"""StepInputs: everything a rank needs to run one step's forward, as plain lists, and its
packing into ONE int64 tensor (what rank 0 broadcasts to the other ranks each step).

Contract: `StepInputs.from_chunks(chunks, block_copies, full_logits_for)` lays a step out as
the model runner runs it (tokens flat, chunk by chunk; a steady step's decode columns read by
index through their `decode_inputs`, engine/scheduling/decode_columns.py); `pack()` -> 1-D
int64 tensor and `StepInputs.unpack(t)` invert each other exactly. Layout of a packed step (all int64):
header [n_tokens, n_chunks, n_samples, n_copies, n_full, n_adapters], then ids, positions,
seq_lens, query_lens, sample_rows, table lengths (one per chunk), the block tables flat,
copies (src, dst pairs), full-logit chunk indices, adapter slots (none, or one per chunk).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from itertools import accumulate
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import torch

_HEADER = 6


@dataclass(frozen=True)
class StepInputs:
    ids: tuple[int, ...]  # [T] the step's new tokens, chunk after chunk
    positions: tuple[int, ...]  # [T]
    tables: tuple[tuple[int, ...], ...]  # per chunk: its sequence's block table
    seq_lens: tuple[int, ...]  # per chunk: tokens in the cache after the step
    query_lens: tuple[int, ...]  # per chunk: new tokens
    sample_rows: tuple[int, ...]  # rows of [T] whose logits are sampled, in chunk order
    block_copies: tuple[tuple[int, int], ...] = ()  # copy-on-write (src, dst) before the step
    full_logits_for: tuple[int, ...] = ()  # chunk indices that want every row's logits
    # per chunk: its request's LoRA slot (-1: the base model); () when no chunk has an adapter
    adapters: tuple[int, ...] = ()

    @classmethod
    def from_chunks(
        cls,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]] = (),
        full_logits_for: frozenset[int] = frozenset(),
    ) -> StepInputs:
        if (columns := getattr(chunks, "decode_inputs", None)) is not None:
            return cls._from_decode_columns(columns(), chunks.seqs, block_copies, full_logits_for)
        ids: list[int] = []
        positions: list[int] = []
        sample_rows: list[int] = []
        for chunk in chunks:
            ids.extend(chunk.input_ids)
            positions.extend(range(chunk.start, chunk.seq_len))
            # the last row, or with a speculative proposal the last 1 + len(proposal) rows
            sample_rows.extend(range(len(ids) - chunk.num_sampled_rows, len(ids)))
        return cls(
            ids=tuple(ids),
            positions=tuple(positions),
            tables=tuple(tuple(c.seq.block_table) for c in chunks),
            seq_lens=tuple(c.seq_len for c in chunks),
            query_lens=tuple(c.num_new_tokens for c in chunks),
            sample_rows=tuple(sample_rows),
            block_copies=tuple((int(s), int(d)) for s, d in block_copies),
            full_logits_for=tuple(sorted(full_logits_for)),
            adapters=adapter_slots(chunks),
        )

    @classmethod
    def _from_decode_columns(
        cls,
        columns: tuple[list[int], list[int], list[Any]],
        seqs: Sequence[Any],
        block_copies: Sequence[tuple[int, int]],
        full_logits_for: frozenset[int],
    ) -> StepInputs:
        """A steady decode step held as columns (engine/scheduling/decode_columns.py): row i
        is chunk i, one token at its start, sampled; the same inputs as its chunks give."""
        ids, starts, requests = columns
        n = len(ids)
        return cls(
            ids=tuple(ids),
            positions=tuple(starts),
            tables=tuple(tuple(seq.block_table) for seq in seqs),
            seq_lens=tuple(start + 1 for start in starts),
            query_lens=(1,) * n,
            sample_rows=tuple(range(n)),
            block_copies=tuple((int(s), int(d)) for s, d in block_copies),
            full_logits_for=tuple(sorted(full_logits_for)),
            adapters=request_slots(requests),
        )

    @property
    def row_starts(self) -> list[int]:
        """Per chunk: its first row in [T]."""
        return [0, *accumulate(self.query_lens)][:-1]

    def pack(self) -> torch.Tensor:
        lens = [len(t) for t in self.tables]
        header = [len(self.ids), len(self.tables), len(self.sample_rows)]
        header += [len(self.block_copies), len(self.full_logits_for), len(self.adapters)]
        values = [
            *header,
            *self.ids,
            *self.positions,
            *self.seq_lens,
            *self.query_lens,
            *self.sample_rows,
            *lens,
            *(b for t in self.tables for b in t),
            *(x for pair in self.block_copies for x in pair),
            *self.full_logits_for,
            *self.adapters,
        ]
        import torch  # here: what reads a step's rows (cuda_graphs/buckets.py) stays torch-free

        return torch.tensor(values, dtype=torch.int64)

    @classmethod
    def unpack(cls, packed: torch.Tensor) -> StepInputs:
        values = packed.tolist()
        n_tokens, n_chunks, n_samples, n_copies, n_full, n_adapters = values[:_HEADER]
        pos = _HEADER

        def take(n: int) -> list[int]:
            nonlocal pos
            pos += n
            return values[pos - n : pos]

        ids, positions = take(n_tokens), take(n_tokens)
        seq_lens, query_lens = take(n_chunks), take(n_chunks)
        sample_rows = take(n_samples)
        lens = take(n_chunks)
        tables = tuple(tuple(take(n)) for n in lens)
        flat = take(2 * n_copies)
        return cls(
            ids=tuple(ids),
            positions=tuple(positions),
            tables=tables,
            seq_lens=tuple(seq_lens),
            query_lens=tuple(query_lens),
            sample_rows=tuple(sample_rows),
            block_copies=tuple(zip(flat[::2], flat[1::2], strict=True)),
            full_logits_for=tuple(take(n_full)),
            adapters=tuple(take(n_adapters)),
        )

    def adapter_rows(self) -> list[int] | None:
        """[T] each row's LoRA slot (its chunk's), or None when every row is the base model's."""
        if not any(slot >= 0 for slot in self.adapters):
            return None
        return [s for s, n in zip(self.adapters, self.query_lens, strict=True) for _ in range(n)]


def adapter_slots(chunks: Sequence[object]) -> tuple[int, ...]:
    """Each chunk's LoRA slot (-1: the base model; a chunk without a request, a draft model's,
    is the base's), or () when every chunk is the base model's."""
    return request_slots(getattr(c, "request", None) for c in chunks)


def request_slots(requests: Iterable[object]) -> tuple[int, ...]:
    """`adapter_slots` of the chunks of these requests (a steady step's columns)."""
    slots = tuple(getattr(r, "lora_slot", -1) for r in requests)
    return slots if any(s >= 0 for s in slots) else ()
