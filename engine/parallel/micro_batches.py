"""Micro-batches of one step for pipeline parallel: the step's rows cut into up to P
contiguous, near-equal ranges, so P stages each work on a different one at once.

Contract: `micro_batches(step, parts)` returns at most `parts` (and at most one per row)
`MicroBatch`es covering the step's rows [0, T) in order, the first ones one row longer when
they do not divide. A chunk whose rows straddle a cut becomes two pieces, exactly as chunked
prefill would make them: the first piece's K/V are in the cache when the second attends (a
stage runs its micro-batches in order), so each piece's `seq_lens` counts the tokens in the
cache after it and its `query_lens` its own rows. `returned` lists, relative to the
micro-batch, the rows stage 0 reads back from the last stage: sampled rows and every row of a
chunk that asked for all its logits (the other rows' hidden states never travel back).
Pure Python: every rank computes the same cut from the same step.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.step_inputs import StepInputs


@dataclass(frozen=True)
class MicroBatch:
    rows: tuple[int, int]  # [lo, hi) of the step's rows
    tables: tuple[tuple[int, ...], ...]  # per piece: its sequence's block table
    seq_lens: tuple[int, ...]  # per piece: tokens in the cache after it
    query_lens: tuple[int, ...]  # per piece: its rows
    returned: tuple[int, ...]  # rows (0 = this micro-batch's first) stage 0 reads back

    @property
    def num_rows(self) -> int:
        return self.rows[1] - self.rows[0]


def micro_batches(step: StepInputs, parts: int) -> list[MicroBatch]:
    total = len(step.ids)
    count = max(1, min(parts, total))
    wanted = set(step.sample_rows)
    for i in step.full_logits_for:
        start = step.row_starts[i]
        wanted.update(range(start, start + step.query_lens[i]))
    base, extra = divmod(total, count)
    out, lo = [], 0
    for m in range(count):
        hi = lo + base + (1 if m < extra else 0)
        out.append(_cut(step, lo, hi, wanted))
        lo = hi
    return out


def _cut(step: StepInputs, lo: int, hi: int, wanted: set[int]) -> MicroBatch:
    tables, seq_lens, query_lens = [], [], []
    for start, n, seq_len, table in zip(
        step.row_starts, step.query_lens, step.seq_lens, step.tables, strict=True
    ):
        a, b = max(lo, start), min(hi, start + n)
        if a >= b:
            continue
        tables.append(table)
        seq_lens.append(seq_len - (start + n - b))  # the rows after b are not cached yet
        query_lens.append(b - a)
    returned = tuple(r - lo for r in range(lo, hi) if r in wanted)
    return MicroBatch((lo, hi), tuple(tables), tuple(seq_lens), tuple(query_lens), returned)
