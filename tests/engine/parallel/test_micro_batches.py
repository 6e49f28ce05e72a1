"""A step's rows are cut into up to P contiguous near-equal micro-batches; a chunk straddling
a cut becomes two pieces whose cache lengths are those chunked prefill would give, and only
the rows stage 0 reads (sampled, prompt-logprob) come back (hand-worked cases)."""

from __future__ import annotations

from engine.parallel.micro_batches import micro_batches
from engine.step_inputs import StepInputs


def _step(query_lens, seq_lens, sample_rows, full=()) -> StepInputs:
    total = sum(query_lens)
    return StepInputs(
        ids=tuple(range(total)),
        positions=tuple(range(total)),
        tables=tuple((i,) for i in range(len(query_lens))),
        seq_lens=tuple(seq_lens),
        query_lens=tuple(query_lens),
        sample_rows=tuple(sample_rows),
        full_logits_for=tuple(full),
    )


def test_a_prefill_chunk_straddling_the_cut_becomes_two_pieces() -> None:
    # chunk 0: 10 new rows (cache 10 after), chunk 1: 6 rows (cache 6), samples row 15;
    # chunk 1 asks for every row's logits.
    step = _step([10, 6], [10, 6], [15], full=[1])
    first, second = micro_batches(step, 2)
    assert (first.rows, first.tables, first.seq_lens, first.query_lens) == (
        (0, 8),
        ((0,),),
        (8,),  # the chunk's first 8 rows: 8 tokens cached after them
        (8,),
    )
    assert (second.rows, second.tables, second.seq_lens, second.query_lens) == (
        (8, 16),
        ((0,), (1,)),
        (10, 6),
        (2, 6),
    )
    assert (first.returned, second.returned) == ((), (2, 3, 4, 5, 6, 7))


def test_decodes_split_one_row_each_and_never_more_parts_than_rows() -> None:
    step = _step([1, 1, 1], [5, 9, 3], [0, 1, 2])
    batches = micro_batches(step, 2)
    assert [b.rows for b in batches] == [(0, 2), (2, 3)]  # the first takes the remainder
    assert [b.seq_lens for b in batches] == [(5, 9), (3,)]
    assert [b.returned for b in batches] == [(0, 1), (0,)]
    assert [b.rows for b in micro_batches(_step([1], [4], [0]), 4)] == [(0, 1)]
