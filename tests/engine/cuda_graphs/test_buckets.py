"""Bucket choice, padding and static-buffer filling of the decode CUDA graphs (pure logic)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from engine.cuda_graphs.buckets import DecodeRows, bucket_for, graph_buckets, pad_decode_rows
from engine.cuda_graphs.static_inputs import StaticDecodeInputs


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


def test_decode_rows_from_chunks_address_the_last_token() -> None:
    # block_size 4: position 5 of a sequence with blocks [7, 3] is offset 1 of block 3.
    seq = SimpleNamespace(token_ids=[10, 11, 12, 13, 14, 15], block_table=[7, 3])
    rows = DecodeRows.from_chunks([SimpleNamespace(seq=seq, start=5)], block_size=4)
    assert rows == DecodeRows([15], [5], [13], [[7, 3]], [6])


def test_padding_rows_touch_only_the_scratch_block() -> None:
    rows = DecodeRows([5, 6], [9, 3], [41, 18], [[10, 2, 1], [4]], [10, 4])
    padded = pad_decode_rows(rows, bucket=4, scratch_block=99, block_size=4)
    assert padded.num_rows == 4
    assert padded.token_ids[:2] == rows.token_ids and padded.slots[:2] == rows.slots
    assert padded.block_tables[:2] == rows.block_tables and padded.seq_lens[:2] == rows.seq_lens
    for i in (2, 3):
        assert padded.slots[i] // 4 == 99 and padded.block_tables[i] == [99]
        assert padded.seq_lens[i] == 1 and padded.positions[i] == 0
    assert pad_decode_rows(rows, 2, 99, 4) == rows
    with pytest.raises(ValueError, match="do not fit"):
        pad_decode_rows(rows, 1, 99, 4)


def test_fill_writes_the_first_rows_and_pads_tables_with_their_first_block() -> None:
    inputs = StaticDecodeInputs(max_rows=4, max_blocks_per_seq=3, device=torch.device("cpu"))
    ids_buffer = inputs.input_ids
    inputs.fill(DecodeRows([1, 2, 3, 4], [0, 0, 0, 0], [8, 9, 10, 11], [[2]] * 4, [1] * 4))
    rows = DecodeRows([5, 6], [9, 3], [41, 18], [[10, 2, 1], [4]], [10, 4])
    inputs.fill(rows)
    assert inputs.input_ids is ids_buffer  # never reallocated: graphs hold the address
    assert inputs.input_ids.tolist() == [5, 6, 3, 4]
    assert inputs.positions[:2].tolist() == [9, 3]
    assert inputs.slot_mapping[:2].tolist() == [41, 18]
    assert inputs.seq_lens[:2].tolist() == [10, 4]
    assert inputs.block_tables[:2].tolist() == [[10, 2, 1], [4, 4, 4]]
    meta = inputs.metadata(2, 4, None, False, rows.seq_lens)
    assert meta.block_tables.data_ptr() == inputs.block_tables.data_ptr()
    assert meta.query_lens == [1, 1] and meta.seq_lens_list == [10, 4]
    with pytest.raises(ValueError, match="exceed"):
        inputs.fill(DecodeRows([0] * 5, [0] * 5, [0] * 5, [[0]] * 5, [1] * 5))
    with pytest.raises(ValueError, match="block table of 4 blocks"):
        inputs.fill(DecodeRows([0], [0], [0], [[0, 1, 2, 3]], [1]))
