"""The attention backend (models/attention_backend.py) builds an eager step's metadata before
the forward: the same slots, tables, lengths and Triton tile plan as the hand-built metadata
(`AttentionMetadata.build`, `TilePlan.build`), from one tensor of host data; and only a
backend whose kernel reads everything from device tensors hands out decode buffers."""

from __future__ import annotations

import pytest
import torch

from models.attention import AttentionMetadata
from models.attention_backend import AttentionBackend, BlockAttentionBackend, CppAttentionBackend
from models.triton_attention.backend import TritonAttentionBackend
from models.triton_attention.tile_plan import TilePlan

# Three sequences: a prefill of 9 (two Triton tiles of 8 tokens at group 8), a chunk of 3 on
# a cached prefix, a decode; ragged block tables.
TABLES = [[5, 2, 7], [1, 9], [4, 3, 8, 6]]
SEQ_LENS = [9, 7, 14]
QUERY_LENS = [9, 3, 1]
BLOCK_SIZE, GROUP = 4, 8


BACKENDS = [BlockAttentionBackend, CppAttentionBackend, TritonAttentionBackend]


def _backend(kind: type[AttentionBackend], window: int | None = None) -> AttentionBackend:
    return kind(GROUP, BLOCK_SIZE, window, torch.device("cpu"))


@pytest.mark.parametrize("kind", BACKENDS, ids=lambda k: k.__name__)
def test_build_lays_out_what_the_hand_built_metadata_holds(kind: type[AttentionBackend]) -> None:
    backend = _backend(kind, window=5)
    meta = backend.build(TABLES, SEQ_LENS, QUERY_LENS)
    want = AttentionMetadata.build(TABLES, SEQ_LENS, QUERY_LENS, BLOCK_SIZE, sliding_window=5)
    for name in ("slot_mapping", "block_tables", "seq_lens"):
        assert torch.equal(getattr(meta, name), getattr(want, name)), name
    assert meta.backend is backend and meta.sliding_window == 5  # its kernel runs the layers
    assert (meta.query_lens, meta.seq_lens_list) == (QUERY_LENS, SEQ_LENS)
    if kind is TritonAttentionBackend:
        plan, want_plan = meta._tiles, TilePlan.build(want, GROUP)
        assert plan is not None and plan.group == GROUP and plan.num_tiles == 4
        for name in ("query_start", "tile_seq", "tile_first"):
            assert getattr(plan, name).tolist() == getattr(want_plan, name).tolist(), name
    elif kind is CppAttentionBackend:
        assert meta._rows is not None  # planned before the forward
    else:
        assert meta._blocks is not None and meta._blocks.group == GROUP


def test_build_makes_one_tensor_from_the_host_lists(monkeypatch) -> None:
    made = []
    tensor = torch.tensor

    def counted(*args, **kwargs):
        made.append(1)
        return tensor(*args, **kwargs)

    monkeypatch.setattr(torch, "tensor", counted)
    _backend(TritonAttentionBackend).build(TABLES, SEQ_LENS, QUERY_LENS)
    assert made == [1]  # one host tensor, hence one transfer on a GPU


@pytest.mark.parametrize("kind", BACKENDS[:2], ids=lambda k: k.__name__)
def test_only_the_triton_backend_hands_out_decode_buffers(kind: type[AttentionBackend]) -> None:
    with pytest.raises(ValueError, match="no capture"):
        _backend(kind).decode_buffers(4, 3, scratch_block=0)
    triton = _backend(TritonAttentionBackend)
    buffers = triton.decode_buffers(4, 3, scratch_block=0)
    assert buffers.max_rows == 4 and buffers.width == 3
    assert buffers.build_for_capture(2).meta.backend is triton  # captured steps run its kernel
