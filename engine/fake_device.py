"""FakeDeviceRunner: a `Runner` (engine/runner.py) with no model, whose every step takes a fixed
device time on a device thread of its own: what the engine's host time per step is measured
against, on a machine with no accelerator (bench/fake_device.py, `Engine.with_fake_device`).

Contract: `FakeDeviceRunner(vocab_size, device_s)`. `submit(chunks, ...)` hands the step to
the device thread and returns at once (`execute` is `submit(...).result()`). The device thread
holds each step `device_s` seconds (a sleep: the host's cores stay free, as they do while a GPU
runs) and writes its logits: greedy decoding of row r in step k picks (7 * k + r) % vocab_size,
so outputs are deterministic and never stop on their own; the step's sampling (the runner
floor's `StepSampler`, as a real runner's) runs there too, inside the device time, as it would
on a GPU's stream. `waited_s` adds up how long the host waited for results (a step's host time
is its wall time less that wait); `device_cpu_s` adds up the device thread's CPU time (what a
real device would spend, all of it, its wake-ups and hand-backs included: the engine's host
time is the process's CPU time less it). The thread
is a daemon and `close()` stops it and joins it. `num_steps` counts the steps run, `submitted_in_flight`
those submitted while the step before was still on the device (the overlapped loop's second
part: step k+1 scheduled before step k's tokens reached the host); carried inputs are resolved
on the device thread (engine/carried_inputs.py). Prompt logprobs are
answered from zero logits.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import dataclass
from queue import SimpleQueue
from types import MappingProxyType
from typing import Any

import torch

from engine.carried_inputs import CarriedTokens
from engine.description import EngineDescription
from engine.sampling.step_io import StepOutput, StepSampling
from engine.sampling.step_sampler import StepSampler
from models.config import ModelConfig


@dataclass(frozen=True)
class FakePath:
    description: str
    attention_kernel: bool = False


@dataclass
class _Waited:
    """A submitted step; `result()` waits for it, adding the wait to the runner's `waited_s`."""

    runner: FakeDeviceRunner
    done: Future

    def result(self) -> StepOutput:
        waiting = time.perf_counter()
        try:
            return self.done.result()
        finally:
            self.runner.waited_s += time.perf_counter() - waiting


class FakeDeviceRunner:
    def __init__(
        self, vocab_size: int, device_s: float, max_model_len: int = 4096, seed: int = 0
    ) -> None:
        one = dict(hidden_size=1, intermediate_size=1, num_layers=1, num_heads=1, head_dim=1)
        self.config = ModelConfig(
            architecture="FakeDevice",
            family="llama",
            vocab_size=vocab_size,
            num_kv_heads=1,
            max_position_embeddings=max_model_len,
            **one,
        )
        self.device = torch.device("cpu")
        self.device_s = device_s
        self.forward_path = FakePath(f"a fake device: {device_s * 1e3:g} ms a step")
        self.num_steps = 0
        self.waited_s = 0.0
        self.device_cpu_s = 0.0  # the device thread's CPU time (its logits and the sampling)
        self.step_sampler = StepSampler(self.device, seed)
        self.carried_tokens = CarriedTokens()  # the previous step's, on the device thread
        self.submitted_in_flight = 0  # steps submitted while the one before was still running
        self._last: Future | None = None
        self._jobs: SimpleQueue[tuple[int, Sequence[Any], StepSampling, Future] | None] = (
            SimpleQueue()
        )
        self._thread = threading.Thread(target=self._device, name="fake-device", daemon=True)
        self._thread.start()

    @property
    def vocab_size(self) -> int:
        return self.config.vocab_size

    @property
    def description(self) -> str:
        return self.forward_path.description

    def execute(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]] = (),
        sampling: StepSampling | None = None,
    ) -> StepOutput:
        return self.submit(chunks, block_copies, sampling).result()

    def submit(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]] = (),
        sampling: StepSampling | None = None,
    ) -> _Waited:
        """Hands the step to the device thread and returns at once."""
        if sampling is None:
            sampling = StepSampling.argmax(sum(c.num_sampled_rows for c in chunks))
        done: Future = Future()
        if self._last is not None and not self._last.done():
            self.submitted_in_flight += 1  # the host got here before the device finished
        self._last = done
        self._jobs.put((self.num_steps, chunks, sampling, done))
        self.num_steps += 1
        return _Waited(self, done)

    def _device(self) -> None:
        # One intra-op thread (a per-thread setting): a second OpenMP team spinning beside the
        # engine's would bill the host for CPU a real device does not take from it.
        torch.set_num_threads(1)
        cpu = time.thread_time()  # all of this thread's CPU is the device's: its waits too
        while (job := self._jobs.get()) is not None:
            step, chunks, sampling, done = job
            try:
                until = time.perf_counter() + self.device_s
                chunks = self.carried_tokens.resolve(chunks, sampling.carried)
                self.carried_tokens.drop()
                rows = sum(c.num_sampled_rows for c in chunks)
                logits = torch.zeros(rows, self.vocab_size)  # [rows, vocab]
                picks = (7 * step + torch.arange(rows)) % self.vocab_size
                logits[torch.arange(rows), picks] = 1.0
                full = {
                    i: torch.zeros(chunks[i].num_new_tokens, self.vocab_size)
                    for i in sampling.full_logits_for
                }
                out = self.step_sampler.sample_step(logits, full, sampling)
                self.carried_tokens.keep(out)
                time.sleep(max(until - time.perf_counter(), 0.0))
                self.device_cpu_s += time.thread_time() - cpu
                cpu = time.thread_time()
                done.set_result(out)
            except Exception as exc:  # the step fails, the device thread goes on
                done.set_exception(exc)

    def describe(self) -> EngineDescription:
        return EngineDescription(
            forward_path=self.forward_path.description,
            cpu_kernels=False,
            cuda_graphs=False,
            gguf_blocks_as_stored=False,
            held_bytes=MappingProxyType({"weights": 0, "KV cache": 0}),
            kv_cache_itemsize=0,
            kv_bytes_per_token=0,
            kv_bytes_per_token_all_heads=0,
        )

    def between_requests(self, idle: Callable[[], bool]) -> bool:
        return False

    def watch_failures(self, on_failure: Callable[[str], None]) -> None:
        pass

    def close(self) -> None:
        # Joined, not left to the interpreter's exit: a daemon thread still inside torch when
        # the interpreter tears down aborts the process ("terminate called without an active
        # exception", seen at the bench's exit).
        self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join(timeout=10.0)
