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
