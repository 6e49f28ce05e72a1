"""Bucket choice of the decode CUDA graphs and a decode step's host rows (pure logic). The
padding and the persistent buffers: tests/models/test_decode_buffers.py."""

from __future__ import annotations

import pytest

from engine.cuda_graphs.buckets import DecodeRows, bucket_for, graph_buckets
from engine.requests.request import PLACEHOLDER, TokenSequence
from engine.scheduling.step_plan import ScheduledChunk


def test_buckets_double_up_to_max_num_seqs_and_end_on_it() -> None:
    assert graph_buckets(64) == (1, 2, 4, 8, 16, 32, 64)
    assert graph_buckets(48) == (1, 2, 4, 8, 16, 32, 48)
    assert graph_buckets(1) == (1,)
    with pytest.raises(ValueError, match="max_num_seqs"):
        graph_buckets(0)


@pytest.mark.parametrize("max_num_seqs", [1, 5, 48, 64, 100])
def test_each_batch_size_gets_the_smallest_bucket_that_holds_it(max_num_seqs: int) -> None:
    buckets = graph_buckets(max_num_seqs)
    for n in range(1, max_num_seqs + 1):
        bucket = bucket_for(n, buckets)
        assert bucket == min(b for b in buckets if b >= n)
        assert bucket <= 2 * n  # at most half of a replay is padding
    assert bucket_for(0, buckets) is None
    assert bucket_for(max_num_seqs + 1, buckets) is None  # no graph: the step runs eagerly


def test_decode_rows_from_chunks_feed_the_last_token_at_its_position() -> None:
    seq = TokenSequence(0, [10, 11, 12, 13, 14, 15], 3, block_table=[7, 3])
    rows = DecodeRows.from_chunks([ScheduledChunk(None, seq, 5, 1, True)])
    assert rows == DecodeRows([15], [5], [[7, 3]])
    assert rows.num_rows == 1
    # The overlapped loop's placeholder, resolved below the runner (carried_inputs.py).
    seq.token_ids[5] = PLACEHOLDER
    carried = ScheduledChunk(None, seq, 5, 1, True, carried_input=42)
    assert DecodeRows.from_chunks([carried]) == DecodeRows([42], [5], [[7, 3]])


def test_decode_columns_give_the_rows_of_their_chunks() -> None:
    """A steady step held as columns (engine/scheduling/decode_columns.py), read by index,
    gives the rows (and the decode-only verdict) of the chunks it stands for: carried inputs
    and a LoRA row included."""
    from types import SimpleNamespace

    from engine.carried_inputs import CarriedTokens
    from engine.model_runner import _decode_only
    from engine.sampling.step_io import StepOutput
    from engine.scheduling.decode_columns import DecodeColumns

    seqs = [
        TokenSequence(0, [10, 11, 12], 2, block_table=[7]),
        TokenSequence(0, [20, 21, 22, 23, 24], 3, block_table=[4, 1]),
    ]
    for lora in (-1, 2):
        requests = [SimpleNamespace(lora_slot=-1), SimpleNamespace(lora_slot=lora)]
        columns = DecodeColumns(requests, seqs, [2, 4])
        for carried in ((), ((1, 0),)):
            tokens = CarriedTokens()
            tokens.keep(StepOutput(tokens=(42,)))
            resolved = tokens.resolve(columns, carried)
            rows = DecodeRows.from_chunks(resolved)
            assert rows == DecodeRows.from_chunks(tokens.resolve(list(columns), carried))
            assert rows.token_ids == ([12, 42] if carried else [12, 24])
            assert rows.adapter_slots == (None if lora < 0 else [-1, 2])
            assert _decode_only(resolved) and _decode_only(list(resolved))
    seqs[0].token_ids.append(13)  # its last token is not the input any more: not a decode
    assert not _decode_only(columns) and not _decode_only(list(columns))
