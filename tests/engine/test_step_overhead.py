"""The engine's own per-step work does not grow with a request's output length: outputs are
deltas and nothing copies a whole sequence per step (a regression here is quadratic in the
output length). A fake runner (no model) makes the engine's bookkeeping the whole step.
"""

from __future__ import annotations

import statistics
import time
from types import SimpleNamespace

import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.sampling_params import SamplingParams
from engine.runner import DoneStep
from engine.sampling.step_io import StepOutput, StepSampling
from engine.sampling.step_sampler import StepSampler
from engine.scheduling.block_manager import BlockManager
from engine.scheduling.scheduler import Scheduler

VOCAB = 64


class ByteTokenizer:
    """Token i is the byte ord('a') + i % 26; nothing is special."""

    vocab_size = VOCAB
    eos_token_ids = ()

    def token_bytes(self, token_id: int) -> bytes:
        return bytes([ord("a") + token_id % 26])

    def is_special(self, token_id: int) -> bool:
        return False


class CyclingRunner:
    """Logits that make greedy decoding cycle through the vocabulary: cheap and deterministic."""

    config = SimpleNamespace(vocab_size=VOCAB, is_encoder_decoder=False, generation={})
    device = torch.device("cpu")
    vocab_size = VOCAB

    def between_requests(self, idle) -> bool:
        return False  # one way to run

    def __init__(self) -> None:
        self.calls = 0
        self.step_sampler = StepSampler(self.device, 0)  # the runner floor's sampling

    def execute(self, chunks, block_copies=(), sampling: StepSampling | None = None) -> StepOutput:
        rows = sum(1 for c in chunks if c.sample)
        logits = torch.zeros(rows, VOCAB)
        logits[:, (self.calls * 7) % VOCAB] = 1.0
        self.calls += 1
        return self.step_sampler.sample_step(logits, {}, sampling or StepSampling.argmax(rows))

    def submit(self, chunks, block_copies=(), sampling: StepSampling | None = None) -> DoneStep:
        return DoneStep(self.execute(chunks, block_copies, sampling))


def _engine(max_len: int) -> Engine:
    config = EngineConfig(block_size=16, max_model_len=max_len, max_num_seqs=4)
    scheduler = Scheduler(config, BlockManager(max_len // 16 + 4, 16, False), max_len)
    return Engine(CyclingRunner(), scheduler, ByteTokenizer(), config, "fake", ())


def _step_times(output_len: int, windows: tuple[range, ...]) -> list[list[float]]:
    engine = _engine(output_len + 64)
    params = SamplingParams(
        max_tokens=output_len, temperature=0.0, logprobs=1, stop=("zzzz",), ignore_eos=True
    )
    engine.add_request("r", list(range(1, 9)), params)
    times: list[list[float]] = [[] for _ in windows]
    step = 0
    while engine.has_unfinished_requests():
        start = time.perf_counter()
        engine.step()
        elapsed = time.perf_counter() - start
        for i, window in enumerate(windows):
            if step in window:
                times[i].append(elapsed)
        step += 1
    return times


def _low(samples: list[float]) -> float:
    """A low quantile: robust to other processes stealing the CPU in some steps."""
    return statistics.quantiles(samples, n=5)[0]


def test_steps_at_output_4000_cost_what_steps_at_output_100_cost() -> None:
    ratios = []
    for _ in range(5):  # a slower attempt can be a busy machine; a real regression fails all
        early, late = _step_times(4100, (range(100, 300), range(3900, 4100)))
        ratios.append(_low(late) / _low(early))
        if ratios[-1] <= 1.10:
            break
    assert min(ratios) <= 1.10, f"late steps cost {min(ratios):.2f}x early ones"
