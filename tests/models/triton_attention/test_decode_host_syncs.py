"""The capturable decode forward (the Triton path over its persistent decode buffers) makes no
host sync and no host-to-device copy: what a CUDA graph records must hold none. Counted on
CPU with the recorder of tests/engine/test_host_syncs.py (tensor reads, data-dependent ops,
tensors made from host data, moves to a device) while the forward and LM head run; the
Triton launches themselves are let through (the interpreter copies their tensors to and fro;
on a GPU a launch is a launch) and counted. The step's one copy is the replay builder's."""

from __future__ import annotations

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from tests.engine.test_host_syncs import _SyncRecorder, recording
from tests.models.triton_attention.decode_case import decode_case


def _allow_kernel_launches(monkeypatch, rec: _SyncRecorder) -> dict[str, int]:
    """Lets the Triton kernels' launches run unrecorded (on CPU the interpreter copies their
    tensors to and fro; on a GPU a launch is a launch) and counts them."""
    from models.triton_attention import kv_write, paged_attention, split_decode

    launches: dict[str, int] = {}

    class Launch:
        def __init__(self, name: str, kernel) -> None:
            self.name, self.kernel = name, kernel

        def __getitem__(self, grid):
            def run(*args, **kwargs):
                launches[self.name] = launches.get(self.name, 0) + 1
                rec.allowed += 1
                try:
                    return self.kernel[grid](*args, **kwargs)
                finally:
                    rec.allowed -= 1

            return run

    for module, attr in (
        (paged_attention, "_paged_attention_kernel"),
        (split_decode, "_split_kernel"),
        (split_decode, "_merge_kernel"),
        (kv_write, "_write_kv_kernel"),
    ):
        monkeypatch.setattr(module, attr, Launch(attr, getattr(module, attr)))
    return launches


@pytest.mark.parametrize("kv_cache_dtype", ["auto", "fp8"])
def test_the_capturable_decode_forward_reads_nothing_and_copies_nothing_in(
    cpu_triton, monkeypatch, kv_cache_dtype
) -> None:
    """The Triton path's decode forward + LM head over its persistent buffers (what a CUDA
    graph records): no read of tensor data, no data-dependent op, no tensor from host data,
    no move to a device, whatever the kernels' launchers do around the launches; over an fp8
    cache too (its rows quantised by torch ops, the cache viewed as e4m3 at launch)."""
    case = decode_case(kv_cache_dtype=kv_cache_dtype)
    step = case.buffers.build_for_replay(case.token_ids, case.positions, case.tables, 4)
    num_layers = len(case.driver.kv)
    with recording(monkeypatch, host_copies=True) as rec:
        launches = _allow_kernel_launches(monkeypatch, rec)
        with torch.inference_mode():
            logits = case.path.logits(case.path.hidden(step.input_ids, step.positions, step.meta))
    assert rec.syncs == []
    # a decode step of 4 rows splits each row's keys: split and merge per layer
    kernels = ("_split_kernel", "_merge_kernel", "_write_kv_kernel")
    assert launches == dict.fromkeys(kernels, num_layers)
    assert logits.shape[0] == 4


def test_a_mixed_step_forward_reads_nothing_back(cpu_triton, monkeypatch) -> None:
    """The same for an eager mixed step (two prompts' prefill chunks, metadata built before the
    forward by the path's backend): no host sync inside the forward, which on a GPU would make
    the host wait for every layer's kernels instead of running ahead of them."""
    case = decode_case()
    driver, path = case.driver, case.path
    gen = torch.Generator().manual_seed(1)
    prompts = {driver.add_sequence(): torch.randint(3, 300, (11,), generator=gen).tolist()}
    prompts |= {driver.add_sequence(): torch.randint(3, 300, (5,), generator=gen).tolist()}
    tables, ids, positions = [], [], []
    for seq, toks in prompts.items():
        while len(driver.tables[seq]) * driver.block_size < len(toks):
            driver.tables[seq].append(driver.free.pop())
        tables.append(driver.tables[seq])
        ids += toks
        positions += range(len(toks))
    lens = [len(t) for t in prompts.values()]
    meta = path.attention.build(tables, lens, lens)
    ids_t, positions_t = torch.tensor(ids), torch.tensor(positions)
    with recording(monkeypatch, host_copies=True) as rec:
        launches = _allow_kernel_launches(monkeypatch, rec)
        with torch.inference_mode():
            logits = path.logits(path.hidden(ids_t, positions_t, meta))
    assert rec.syncs == []
    assert launches["_paged_attention_kernel"] == len(driver.kv)
    assert logits.shape[0] == len(ids)


class _OpCounter(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_the_replay_builder_makes_one_copy_per_step(cpu_triton) -> None:
    case = decode_case()
    case.buffers.build_for_capture(4)  # the step's views exist from the capture on
    with _OpCounter() as counter:
        case.buffers.build_for_replay(case.token_ids, case.positions, case.tables, 4)
    copies = [op for op in counter.ops if "copy" in op]
    assert copies == ["copy_"]  # the packed host rows, in one transfer
    assert set(counter.ops) <= {"copy_", "slice", "lift_fresh"}  # lift: from_numpy
