"""No host syncs in the step's hot path: the sampler and the model runner read no device data
back except through `engine.host_transfer.fetch`, once per step.

A CPU has no host/device boundary, so the test records, while a step runs, every operation that
on an accelerator would make the host wait for the device: a read of tensor data
(`aten._local_scalar_dense`: `.item()`, `bool(t)`, `int(t)`; `.tolist()`, `.cpu()`, `.numpy()`),
and every op whose output shape depends on the data (`nonzero`, `unique`, boolean-mask
indexing, `masked_select`, `repeat_interleave` without `output_size`). Calls made inside
`fetch` (and inside `to_device`, which builds tensors from host lists) are allowed; the test
counts the `fetch` calls. A recorder that saw nothing would pass any code: the first test
shows it catches each kind of sync.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from engine import host_transfer
from engine.requests.sampling_params import SamplingParams
from engine.sampling.sampler import Sampler, seeded_generator
from engine.sampling.sampling_batch import SamplingRow
from models.attention_backend import GraphSupport
from models.triton_attention.backend import TritonAttentionBackend

aten = torch.ops.aten
_OURS = ("engine", "models")  # the packages whose host-device doors are followed
_DATA_DEPENDENT = {
    aten._local_scalar_dense,
    aten.nonzero,
    aten._unique2,
    aten.unique_dim,
    aten.unique_consecutive,
    aten.masked_select,
}


class _SyncRecorder(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.syncs: list[str] = []
        self.allowed = 0  # > 0 inside fetch / to_device
        self.fetches = 0

    def note(self, what: str) -> None:
        if not self.allowed:
            self.syncs.append(what)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func.overloadpacket
        if packet in _DATA_DEPENDENT:
            self.note(str(func))
        elif packet is aten.index and any(i is not None and i.dtype == torch.bool for i in args[1]):
            self.note("boolean-mask indexing")
        elif packet is aten.repeat_interleave and kwargs.get("output_size") is None:
            self.note("repeat_interleave without output_size")
        return func(*args, **kwargs)


@contextlib.contextmanager
def recording(monkeypatch, host_copies: bool = False) -> Iterator[_SyncRecorder]:
    """`host_copies`: also record every tensor made from host data (`torch.tensor`,
    `as_tensor`, `from_numpy`) and every move to a device (`.to(device)`, `.cuda()`,
    `.pin_memory()`): none may happen inside a captured forward."""
    rec = _SyncRecorder()

    def host_read(name):
        original = getattr(torch.Tensor, name)

        def wrapper(self, *args, **kwargs):
            rec.note(f"Tensor.{name}")
            return original(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, wrapper)

    # Python's own reads too: under inference mode (the runner's) `.item()` and `int(t)` do
    # not reach a dispatch mode as `_local_scalar_dense`.
    for name in ("tolist", "cpu", "numpy", "item", "__bool__", "__int__", "__float__"):
        host_read(name)
    if host_copies:
        for name in ("tensor", "as_tensor", "from_numpy"):
            made = getattr(torch, name)

            def from_host(*args, _made=made, _name=name, **kwargs):
                rec.note(f"torch.{_name}")
                return _made(*args, **kwargs)

            monkeypatch.setattr(torch, name, from_host)
        for name in ("cuda", "pin_memory"):
            host_read(name)
        to = torch.Tensor.to

        def moving(self, *args, **kwargs):
            if "device" in kwargs or any(
                isinstance(a, str | torch.device | torch.Tensor) for a in args
            ):
                rec.note("Tensor.to(device)")
            return to(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, "to", moving)

    def allowing(fn, count: bool):
        def wrapper(*args, **kwargs):
            rec.allowed += 1
            rec.fetches += count
            try:
                return fn(*args, **kwargs)
            finally:
                rec.allowed -= 1

        return wrapper

    # Every module that took the two doors by name (`from engine.host_transfer import fetch`).
    doors = {"fetch": (host_transfer.fetch, True), "to_device": (host_transfer.to_device, False)}
    for module in [m for name, m in sys.modules.items() if name.split(".")[0] in _OURS]:
        for name, (door, count) in doors.items():
            if getattr(module, name, None) is door:
                monkeypatch.setattr(module, name, allowing(door, count))
    with rec:
        yield rec


def test_the_recorder_sees_each_kind_of_sync(monkeypatch) -> None:
    x = torch.arange(6.0)
    for sync in (
        lambda: x[1].item(),
        lambda: bool(x[0] > 1),
        lambda: x.tolist(),
        lambda: x.cpu(),
        lambda: x[x > 2],
        lambda: torch.nonzero(x),
        lambda: torch.unique(x),
        lambda: torch.repeat_interleave(x, torch.ones(6, dtype=torch.int64)),
    ):
        with recording(monkeypatch) as rec:
            sync()
        assert rec.syncs, sync
        monkeypatch.undo()
    with recording(monkeypatch) as rec:
        (x * 2).argmax().add_(1)
    assert rec.syncs == []


def test_the_recorder_sees_reads_under_inference_mode(monkeypatch) -> None:
    """The runner steps under inference mode, where `.item()` bypasses the dispatch mode."""
    with torch.inference_mode():
        x = torch.arange(6.0)
        for sync in (lambda: x[1].item(), lambda: int(x[1]), lambda: bool(x[0] > 1)):
            with recording(monkeypatch) as rec:
                sync()
            assert rec.syncs, sync
            monkeypatch.undo()


def _rows(vocab: int) -> list[SamplingRow]:
    def row(seed: int | None = None, **params) -> SamplingRow:
        generator = seeded_generator(seed) if seed is not None else None
        return SamplingRow(SamplingParams(**params), (3, 4, 5, 4), (7, 7, 9), generator)

    return [
        row(temperature=0.0),  # greedy
        row(temperature=0.8, seed=11),
        row(temperature=1.0, top_k=5),
        row(temperature=0.7, top_p=0.9, seed=5),
        row(temperature=1.2, min_p=0.1),
        row(temperature=0.0, repetition_penalty=1.3, presence_penalty=0.5, frequency_penalty=0.2),
        row(temperature=0.9, logit_bias={3: 5.0}, min_tokens=8, stop_token_ids=[6]),
        row(temperature=1.0, top_k=20, top_p=0.5, logprobs=3),
        row(temperature=0.0, logprobs=2),
    ]


@pytest.mark.parametrize("plain_greedy", [False, True])
def test_sampling_a_step_reads_the_device_once(monkeypatch, plain_greedy: bool) -> None:
    vocab = 300
    logits = torch.randn(9, vocab, generator=torch.Generator().manual_seed(0))
    rows = _rows(vocab)
    if plain_greedy:
        rows = [SamplingRow(SamplingParams(temperature=0.0))] * 9
    # device_side=True: the variants an accelerator runs (no host decision while filtering).
    sampler = Sampler(eos_token_ids=(2,), seed=0, device_side=True)
    with recording(monkeypatch) as rec:
        out = sampler(logits, rows)
    assert rec.syncs == []
    assert rec.fetches == 1
    assert len(out.token_ids) == 9


def test_device_side_sampling_draws_the_same_tokens_as_the_cpu_way() -> None:
    vocab = 300
    for seed in range(5):
        logits = torch.randn(9, vocab, generator=torch.Generator().manual_seed(seed))
        outs = []
        for device_side in (False, True):
            sampler = Sampler(eos_token_ids=(2,), seed=seed, device_side=device_side)
            outs.append(sampler(logits, _rows(vocab)))
        assert outs[0] == outs[1]


class _StubPath:
    """A forward path with no host reads of its own, so the runner's code alone is observed
    (the CPU attention plans its blocks on the host; the capturable forward's own reads are
    counted below). Its backend's metadata needs no host planning (Triton's layout)."""

    description = "stub"
    attention_kernel = False
    graph_support = GraphSupport.DECODE_ONLY

    def __init__(self, vocab: int, hidden: int, block_size: int) -> None:
        cpu = torch.device("cpu")
        self.attention = TritonAttentionBackend(1, block_size, None, cpu)
        gen = torch.Generator().manual_seed(0)
        self.embed = torch.randn(vocab, hidden, generator=gen)
        self.head = torch.randn(hidden, vocab, generator=gen)

    def hidden(self, input_ids, positions, meta):
        return self.embed[input_ids] + positions.unsqueeze(1) + meta.seq_lens.sum()

    def logits(self, hidden):
        return hidden @ self.head


def _needs_interpreted_triton() -> None:
    """The capturable path's kernels run on CPU tensors in Triton's interpreter only, which
    tests/conftest.py switches on for CPU runs (not under TGSERVE_TEST_DEVICE=cuda)."""
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton kernels on CPU tensors need TRITON_INTERPRET=1 (CPU test runs)")


@pytest.mark.parametrize("graphs", [False, True])
def test_the_model_runner_reads_nothing_back(monkeypatch, graphs: bool) -> None:
    from engine import model_runner
    from engine.cuda_graphs.decode_graphs import GraphSettings
    from tests.engine.cuda_graphs.test_decode_graphs import (
        BLOCK_SIZE,
        NUM_BLOCKS,
        _runner,
        _triton_path,
    )
    from tests.engine.test_model_runner import _Chunk, _Seq

    if graphs:  # the capturable path's runner, its persistent buffers (then the stub path)
        _needs_interpreted_triton()
        monkeypatch.setattr(model_runner, "select_forward_path", _triton_path)
    runner = _runner("llama", GraphSettings(8, 48) if graphs else None)
    assert (runner.decode_graphs is not None) == graphs
    stub = _StubPath(runner.config.vocab_size, 8, BLOCK_SIZE)
    runner.forward_path = stub
    if runner.decode_graphs is not None:
        runner.decode_graphs.path = stub
    seqs = [_Seq(list(range(3, 9 + i)), [2 * i, 2 * i + 1]) for i in range(3)]
    allowed = []
    with recording(monkeypatch) as rec:
        real = model_runner.to_device

        def counted(*args, **kwargs):
            rec.allowed += 1
            allowed.append(1)
            try:
                return real(*args, **kwargs)
            finally:
                rec.allowed -= 1

        monkeypatch.setattr(model_runner, "to_device", counted)
        mixed = [_Chunk(seqs[0], 0, 4, False), _Chunk(seqs[1], 0, len(seqs[1].token_ids), True)]
        runner.forward(mixed, block_copies=[(NUM_BLOCKS - 1, NUM_BLOCKS - 2)])
        out = runner.forward([_Chunk(s, len(s.token_ids) - 1, 1, True) for s in seqs])
    assert rec.syncs == []
    assert allowed  # host lists did reach the "device"
    assert out.sampling.shape[0] == 3


def test_the_recorder_sees_host_copies(monkeypatch) -> None:
    x = torch.arange(6.0)
    for copy in (
        lambda: torch.tensor([1, 2]),
        lambda: torch.as_tensor([1, 2]),
        lambda: x.to("cpu"),
        lambda: x.to(device=torch.device("cpu")),
        lambda: x.pin_memory() if torch.cuda.is_available() else x.cpu(),
    ):
        with recording(monkeypatch, host_copies=True) as rec:
            copy()
        assert rec.syncs, copy
        monkeypatch.undo()
    with recording(monkeypatch, host_copies=True) as rec:
        x.to(torch.float64).mul_(2)
    assert rec.syncs == []
