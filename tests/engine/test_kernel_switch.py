"""The C++ kernels built in the background (engine/kernel_switch.py): the engine starts on
PyTorch ops and switches to the kernels between requests, never within one.

Oracle: each request run alone on an engine that uses one path from its start (cpu_kernels
False: PyTorch ops; the kernels built: the C++ step). A request's tokens and logprobs must
equal, bit for bit, the solo run on the path it started on; the paths themselves differ in the
last bits (checked first, so the test can tell them apart). The build is held back by a gate
until the test lets it through, so "before" and "after" are certain.
"""

from __future__ import annotations

import threading
import time

from gguf import GGMLQuantizationType as QT

from engine import Engine, EngineConfig, kernel_switch
from engine.activation_choice import auto_mode
from engine.requests.sampling_params import SamplingParams
from models import cpu_kernels
from models.activation_quant import Q8Linear
from models.block_linear import BlockLinear
from tests.engine.engine_fixtures import tiny_engine
from tests.models.gguf.test_stored import tiny_quantised_gguf

PROMPT = list(range(5, 19))  # 14 tokens: three full blocks of 4 go to the prefix cache
PARAMS = SamplingParams(max_tokens=6, temperature=0.0, logprobs=2)


def cpu_engine(folder, **config) -> Engine:
    """The switch is the CPU path's (the C++ kernels): on the CPU whatever the tests' device."""
    return tiny_engine(folder, device="cpu", **config)


def solo(engine, prompt: list[int]):
    (out,) = engine.generate([prompt], PARAMS)
    return out.outputs[0].token_ids, out.outputs[0].logprobs


def steps(engine, ids: list, logprobs: list, count: int | None = None) -> tuple:
    """Steps the engine (`count` times, or until it has no work), collecting the one
    request's tokens and logprobs; returns them as tuples."""
    while engine.has_unfinished_requests() and (count is None or count > 0):
        for out in engine.step():
            ids += out.outputs[0].token_ids
            logprobs += out.outputs[0].logprobs
        count = None if count is None else count - 1
    return tuple(ids), tuple(logprobs)


def run(engine, request_id: str, prompt: list[int]) -> tuple:
    engine.add_request(request_id, prompt, PARAMS)
    return steps(engine, [], [])


def test_a_request_keeps_the_path_it_started_on_and_the_next_one_switches(
    tmp_path, monkeypatch
) -> None:
    folder = tmp_path / "tiny"
    on_pytorch = solo(cpu_engine(folder, cpu_kernels=False), PROMPT)
    on_kernels = solo(cpu_engine(folder), PROMPT)
    assert on_pytorch[1] != on_kernels[1]  # the paths are told apart by their logprobs

    gate = threading.Event()
    real_extension = cpu_kernels.extension

    def held_back(niceness: int = 0):
        assert gate.wait(60)
        return real_extension(niceness)

    monkeypatch.setattr(cpu_kernels, "is_built", lambda march="native": False)
    monkeypatch.setattr(kernel_switch.cpu_kernels, "extension", held_back)
    engine = cpu_engine(folder, cpu_kernels_background=True)
    pending = engine.runner.pending_path
    assert pending is not None and not engine.stats().cpu_kernels_active
    assert engine.stats().forward_path == "PyTorch ops only"

    engine.add_request("first", PROMPT, PARAMS)
    ids, logprobs = [], []
    steps(engine, ids, logprobs, count=2)  # started on PyTorch ops
    gate.set()
    deadline = time.monotonic() + 60
    while not pending.ready:
        assert time.monotonic() < deadline, "the kernel path was not built"
        time.sleep(0.05)
    assert steps(engine, ids, logprobs) == on_pytorch  # finished on the path it started on
    assert not engine.stats().cpu_kernels_active

    hits = engine.stats().prefix_cache_hits
    assert run(engine, "second", PROMPT) == on_kernels  # switched at its first step
    stats = engine.stats()
    assert stats.cpu_kernels_active and "C++" in stats.forward_path
    assert stats.prefix_cache_hits == hits  # the first request's K/V (PyTorch's) was dropped
    assert run(engine, "third", PROMPT) == on_kernels  # and caching resumes on the new path
    assert engine.stats().prefix_cache_hits > hits


def test_a_failed_build_leaves_the_pytorch_path_serving(tmp_path, monkeypatch) -> None:
    folder = tmp_path / "tiny"
    on_pytorch = solo(cpu_engine(folder, cpu_kernels=False), PROMPT)
    monkeypatch.setattr(cpu_kernels, "is_built", lambda march="native": False)
    monkeypatch.setattr(kernel_switch.cpu_kernels, "extension", lambda niceness=0: None)
    engine = cpu_engine(folder, cpu_kernels_background=True)
    deadline = time.monotonic() + 30
    while not engine.runner.pending_path.settled:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert run(engine, "a", PROMPT) == on_pytorch
    assert engine.runner.pending_path is None and not engine.stats().cpu_kernels_active


def test_a_gguf_served_dequantised_meanwhile_switches_to_its_blocks_as_stored(
    tmp_path, monkeypatch
) -> None:
    """The blocks as stored need the kernels: until they load, a dequantised copy serves (not
    written to the conversion cache); after the switch, the blocks, as a warm start has them."""
    path = tiny_quantised_gguf(tmp_path, QT.Q4_1, tied=False)
    config = dict(dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4, device="cpu")
    monkeypatch.setenv("TGSERVE_CACHE_DIR", str(tmp_path / "cache"))
    warm = Engine.from_model(str(path), EngineConfig(**config))
    # as stored: Q4_1 blocks, read with int16 activations by default on an AVX2 build
    # (engine/activation_choice), else by the float block kernels
    assert _stored_kinds(warm) == {Q8Linear if auto_mode() else BlockLinear}
    on_kernels = solo(warm, PROMPT)

    monkeypatch.setattr(cpu_kernels, "is_built", lambda march="native": False)
    engine = Engine.from_model(str(path), EngineConfig(**config, cpu_kernels_background=True))
    assert not _stored_kinds(engine)
    deadline = time.monotonic() + 60
    while not engine.runner.pending_path.ready:
        assert time.monotonic() < deadline, "the kernel path was not built"
        time.sleep(0.05)
    assert run(engine, "a", PROMPT) == on_kernels
    assert _stored_kinds(engine) == _stored_kinds(warm)
    auto = auto_mode()
    assert engine.config.activation_quantization == warm.config.activation_quantization == auto
    assert not (tmp_path / "cache").exists() or not any((tmp_path / "cache").iterdir())


def _stored_kinds(engine: Engine) -> set[type]:
    """The kinds of the engine's layers that read a GGUF's blocks as stored."""
    kinds = (BlockLinear, Q8Linear)
    return {type(m) for m in engine.runner.model.modules() if isinstance(m, kinds)}
