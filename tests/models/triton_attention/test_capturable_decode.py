"""The capturable decode forward (the Triton path over its persistent decode buffers,
models/decode_buffers.py), checked on CPU for what a CUDA graph needs:
- metadata built for capture, then overwritten by the replay builder with a real step's rows,
  gives the eager step's logits bit for bit (a captured graph re-runs the same function over
  the same buffers), the step padded to its bucket, and capture wrote only the scratch block;
- the decode forward and LM head compile with `torch.compile(fullgraph=True)`: a graph break
  would mean a host sync or a Python branch on tensor data, which a capture cannot hold.
  Triton's interpreted kernels are not traceable, so this trace runs the kernels' PyTorch
  references (models/triton_attention/reference.py) in their place, checked here against the
  kernels.
The forward's host reads and copies are counted in tests/engine/test_host_syncs.py."""

from __future__ import annotations

import pytest
import torch

from models.triton_attention import kv_write, paged_attention
from models.triton_attention.reference import reference_paged_attention, reference_write_kv
from tests.models.triton_attention.decode_case import PROMPT_LENS, decode_case

BUCKET = 4  # three rows padded to the bucket of four


def _forward(path, step) -> torch.Tensor:
    return path.logits(path.hidden(step.input_ids, step.positions, step.meta))


def test_capture_then_replay_gives_the_eager_step(cpu_triton) -> None:
    case = decode_case()
    n = len(PROMPT_LENS)
    before = [t.clone() for cache in case.driver.kv for t in cache]
    with torch.inference_mode():
        captured = case.buffers.build_for_capture(BUCKET)
        _forward(case.path, captured)  # what the capture records: padding rows only
        after = [t for cache in case.driver.kv for t in cache]
        for old, new in zip(before, after, strict=True):  # only the scratch block was written
            live = [b for b in range(old.shape[0]) if b != case.scratch]
            assert torch.equal(old[live], new[live])
        replay = case.buffers.build_for_replay(case.token_ids, case.positions, case.tables, BUCKET)
        assert replay is captured  # the graph's addresses: the same views, new contents
        assert replay.input_ids.data_ptr() == captured.input_ids.data_ptr()
        assert replay.input_ids[:n].tolist() == case.token_ids
        got = _forward(case.path, replay)[:n]
        want = case.eager_logits()
    assert torch.equal(got, want)


def test_the_padding_rows_name_only_the_scratch_block(cpu_triton) -> None:
    case = decode_case()
    step = case.buffers.build_for_replay(case.token_ids, case.positions, case.tables, BUCKET)
    n, bs = len(PROMPT_LENS), case.driver.block_size
    meta = step.meta
    assert meta.seq_lens.tolist() == [p + 1 for p in case.positions] + [1]
    for i, (pos, table) in enumerate(zip(case.positions, case.tables, strict=True)):
        assert meta.slot_mapping[i] == table[pos // bs] * bs + pos % bs
        assert meta.block_tables[i, : len(table)].tolist() == table
    assert meta.slot_mapping[n] == case.scratch * bs
    assert set(meta.block_tables[n].tolist()) == {case.scratch}
    assert step.input_ids[n] == 0 and step.positions[n] == 0
    wide = case.tables[:1] + [[0] * (case.buffers.width + 1)]
    assert case.buffers.build_for_replay([1, 2], [0, 0], wide, 2) is None  # runs eager
    with pytest.raises(ValueError, match="buffers hold"):
        case.buffers.build_for_capture(case.buffers.max_rows + 1)


def _with_reference_kernels(monkeypatch) -> None:
    monkeypatch.setattr(paged_attention, "triton_paged_attention", reference_paged_attention)
    monkeypatch.setattr(kv_write, "triton_write_kv", reference_write_kv)


def test_the_reference_kernels_compute_what_the_triton_kernels_do(cpu_triton, monkeypatch) -> None:
    case = decode_case()
    with torch.inference_mode():
        want = case.eager_logits()  # Triton, interpreted
        _with_reference_kernels(monkeypatch)
        step = case.buffers.build_for_replay(case.token_ids, case.positions, case.tables, BUCKET)
        got = _forward(case.path, step)[: len(PROMPT_LENS)]
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def test_the_decode_forward_compiles_as_one_graph(cpu_triton, monkeypatch) -> None:
    case = decode_case()
    _with_reference_kernels(monkeypatch)
    path = case.path

    def forward(input_ids, positions, meta):
        return path.logits(path.hidden(input_ids, positions, meta))

    compiled = torch.compile(forward, fullgraph=True, backend="eager", dynamic=False)
    torch._dynamo.reset()
    with torch.inference_mode():
        step = case.buffers.build_for_replay(case.token_ids, case.positions, case.tables, BUCKET)
        want = forward(step.input_ids, step.positions, step.meta)
        got = compiled(step.input_ids, step.positions, step.meta)  # raises on a graph break
    assert torch.equal(got, want)
