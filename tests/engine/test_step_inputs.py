"""StepInputs (engine/step_inputs.py): a step laid out as the runner runs it, on a hand-worked
step, and packed into one int64 tensor that unpacks to the same step."""

from __future__ import annotations

from types import SimpleNamespace

import torch

from engine.scheduling.step_plan import ScheduledChunk
from engine.step_inputs import StepInputs


def _chunk(token_ids, block_table, start, num_new_tokens, sample, proposal=()):
    """The scheduler's chunk over a bare sequence (no request)."""
    seq = SimpleNamespace(token_ids=token_ids, block_table=block_table)
    return ScheduledChunk(None, seq, start, num_new_tokens, sample, tuple(proposal))


# A prefill chunk in the middle of its prompt (tokens 2..4 of 7, samples nothing), then a decode.
CHUNKS = [
    _chunk([10, 11, 12, 13, 14, 15, 16], [3, 4], start=2, num_new_tokens=3, sample=False),
    _chunk([20, 21, 22, 23, 24], [7, 1, 9], start=4, num_new_tokens=1, sample=True),
]


def test_a_step_is_laid_out_chunk_after_chunk() -> None:
    step = StepInputs.from_chunks(CHUNKS, block_copies=[(5, 6)], full_logits_for=frozenset({0}))
    assert step.ids == (12, 13, 14, 24)
    assert step.positions == (2, 3, 4, 4)
    assert step.tables == ((3, 4), (7, 1, 9))
    assert step.seq_lens == (5, 5) and step.query_lens == (3, 1)
    assert step.sample_rows == (3,)  # the decode's only row; the prefill chunk samples nothing
    assert step.row_starts == [0, 3]
    assert step.block_copies == ((5, 6),) and step.full_logits_for == (0,)


def test_a_speculating_decode_feeds_its_proposal_and_samples_every_scored_row() -> None:
    # Known tokens end at 32 (position 2); proposed 40, 41 follow at positions 3, 4.
    speculating = _chunk(
        [30, 31, 32], [2], start=2, num_new_tokens=3, sample=True, proposal=[40, 41]
    )
    step = StepInputs.from_chunks([CHUNKS[0], speculating, CHUNKS[1]])
    assert step.ids == (12, 13, 14, 32, 40, 41, 24)
    assert step.positions == (2, 3, 4, 2, 3, 4, 4)
    assert step.seq_lens == (5, 5, 5) and step.query_lens == (3, 3, 1)
    assert step.sample_rows == (3, 4, 5, 6)


def test_pack_and_unpack_invert_each_other() -> None:
    for step in (
        StepInputs.from_chunks(CHUNKS, block_copies=[(5, 6), (8, 2)], full_logits_for={0, 1}),
        StepInputs.from_chunks(CHUNKS),
        StepInputs.from_chunks([]),
    ):
        packed = step.pack()
        assert packed.dtype == torch.int64 and packed.dim() == 1
        assert StepInputs.unpack(packed) == step
    # The header counts what follows: tokens, chunks, sampled rows, copies, full-logit chunks.
    assert StepInputs.from_chunks(CHUNKS, [(5, 6)]).pack()[:5].tolist() == [4, 2, 1, 1, 0]


def test_decode_columns_give_the_inputs_of_their_chunks() -> None:
    """A steady step held as columns (engine/scheduling/decode_columns.py), read by index,
    lays out as the chunks it stands for; also with inputs carried from the step before and a
    LoRA adapter on one row."""
    from engine.carried_inputs import CarriedTokens
    from engine.sampling.step_io import StepOutput
    from engine.scheduling.decode_columns import DecodeColumns

    seqs = [
        SimpleNamespace(token_ids=[5, 6, 7], block_table=[2]),
        SimpleNamespace(token_ids=[8, 9, 10, 11, 12], block_table=[4, 1]),
        SimpleNamespace(token_ids=[13, 14], block_table=[6]),
    ]
    requests = [SimpleNamespace(lora_slot=-1), SimpleNamespace(lora_slot=3), object()]
    columns = DecodeColumns(requests, seqs, [2, 4, 1])
    for carried in ((), ((0, 1), (2, 0))):  # (row, draw of the step before)
        tokens = CarriedTokens()
        tokens.keep(StepOutput(tokens=(90, 91)))
        resolved = tokens.resolve(columns, carried)
        chunks = tokens.resolve(tuple(columns), carried)
        assert type(resolved) is DecodeColumns and list(resolved) == list(chunks)
        step = StepInputs.from_chunks(resolved, [(1, 2)], frozenset({1}))
        assert step == StepInputs.from_chunks(chunks, [(1, 2)], frozenset({1}))
        assert step.ids == ((91, 12, 90) if carried else (7, 12, 14))
        assert step.adapters == (-1, 3, -1) and step.sample_rows == (0, 1, 2)
