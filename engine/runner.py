"""The runner contract: what the engine steps through, and the one `execute` skeleton both
runners (engine/model_runner.py, engine/encdec_runner.py) share.

Contract:
- `Runner` (a Protocol) is everything the engine reads of a runner: `execute(chunks,
  block_copies, sampling) -> StepOutput` (a step's forward, then its sampling below this
  boundary: `sampling` a `StepSampling`, the result plain host data, engine/sampling/step_io.py),
  `submit(...)` the same, started: its `.result()` is the `StepOutput` (a runner whose device
  works on its own returns at once, so the host works meanwhile: the overlapped loop; a
  synchronous one runs the step in `submit`), `describe()` (engine/description.py),
  `between_requests(idle)` (the hook the engine calls before scheduling each step: the runner
  may change how it runs only when `idle()` says no live request has started; True when it did,
  so cached prefix blocks, K/V of the old way, must go), `watch_failures` / `close` (the
  tensor-parallel group's lifetime; no-ops without one) and the facts `config`, `device`,
  `vocab_size` (the ids the sampler may draw: padded embedding rows excluded), `description`
  (how steps run, for the start-up log) and `forward_path` (its `description` and
  `attention_kernel`, for stats).
- `StepRunner.execute` is the skeleton: `forward(chunks, block_copies, full_logits_for)`, then
  the runner floor's `StepSampler` (engine/sampling/step_sampler.py; its generators seeded with
  `sampling_seed`) turns the logits into the step's `StepOutput` with one device-to-host read;
  chunks whose last input the previous step drew (`StepSampling.carried`, the overlapped loop)
  get it first (engine/carried_inputs.py).
  `forward` is: `_prepare(chunks)` (work that needs the chunks
  themselves: thread counts, an encoder's passes), then `_replay` (a captured decode step,
  or None), else the step's host inputs (`_inputs`: a `StepInputs`, rows flat chunk after chunk)
  go to `_dispatch` (rank 0 of a tensor-parallel group sends them first) and `run`:
  copy-on-write block copies, `_hidden(step)` -> [T, hidden], the sampled rows' logits
  (`_logits`, cut to `vocab_size`), and for `full_logits_for` every new row's logits.
- `StepLogits`: `[num_sampling_rows, vocab]` float32 in chunk order, and per chunk index that
  asked, `[num_new_tokens, vocab]`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Protocol

import torch

from engine.carried_inputs import CarriedTokens
from engine.host_transfer import to_device
from engine.sampling.step_io import StepOutput, StepSampling
from engine.sampling.step_sampler import StepSampler
from engine.step_inputs import StepInputs

if TYPE_CHECKING:
    from engine.description import EngineDescription
    from models.config import ModelConfig


@dataclass(frozen=True)
class StepLogits:
    sampling: torch.Tensor  # [num_sampling_rows, vocab] float32, in chunk order
    all_rows: dict[int, torch.Tensor]  # chunk index -> [num_new_tokens, vocab] when asked


class PathReport(Protocol):
    """What stats read of how a runner's steps run."""

    description: str
    attention_kernel: bool  # tgserve's C++ CPU kernels serve attention (or the whole step)


class PendingStep(Protocol):
    """A step handed to the runner: `result()` waits for its output (or raises its error)."""

    def result(self) -> StepOutput: ...


@dataclass(frozen=True)
class DoneStep:
    """A step that already ran (a synchronous runner's `submit`)."""

    output: StepOutput

    def result(self) -> StepOutput:
        return self.output


class Runner(Protocol):
    config: ModelConfig
    device: torch.device
    forward_path: PathReport

    @property
    def vocab_size(self) -> int: ...

    @property
    def description(self) -> str: ...

    def execute(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]] = (),
        sampling: StepSampling | None = None,
    ) -> StepOutput: ...

    def submit(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]] = (),
        sampling: StepSampling | None = None,
    ) -> PendingStep: ...

    def describe(self) -> EngineDescription: ...

    def between_requests(self, idle: Callable[[], bool]) -> bool: ...

    def watch_failures(self, on_failure: Callable[[str], None]) -> None: ...

    def close(self) -> None: ...


class StepRunner:
    """The shared skeleton; a runner fills in `_inputs`, `_hidden` and `_logits`."""

    config: ModelConfig
    device: torch.device
    kv_caches: list[tuple[torch.Tensor, torch.Tensor]]
    model: torch.nn.Module
    sampleable_vocab: int | None  # None: every id of the LM head is a token
    sampling_seed: int | None = 0  # the step sampler's shared generators (EngineConfig.seed)
    _step_sampler: StepSampler | None = None
    _carried: CarriedTokens | None = None

    @property
    def vocab_size(self) -> int:
        return self.sampleable_vocab or self.config.vocab_size

    @property
    def carried_tokens(self) -> CarriedTokens:
        """The previous step's tokens, for a step that carries them (carried_inputs.py)."""
        if self._carried is None:
            self._carried = CarriedTokens()
        return self._carried

    @property
    def step_sampler(self) -> StepSampler:
        if self._step_sampler is None:
            self._step_sampler = StepSampler(self.device, self.sampling_seed)
        return self._step_sampler

    @torch.inference_mode()
    def execute(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]] = (),
        sampling: StepSampling | None = None,
    ) -> StepOutput:
        """The step's forward, then its sampling (`None`: the argmax of each sampled row)."""
        if sampling is None:
            sampling = StepSampling.argmax(sum(c.num_sampled_rows for c in chunks))
        carried = self.carried_tokens
        chunks = carried.resolve(chunks, sampling.carried)
        carried.drop()  # until this step's output is there
        logits = self.forward(chunks, block_copies, sampling.full_logits_for)
        out = self.step_sampler.sample_step(logits.sampling, logits.all_rows, sampling)
        carried.keep(out)
        return out

    def submit(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]] = (),
        sampling: StepSampling | None = None,
    ) -> PendingStep:
        """On the CPU the runner is the host: the step runs here, then the host goes on."""
        return DoneStep(self.execute(chunks, block_copies, sampling))

    @torch.inference_mode()
    def forward(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]] = (),
        full_logits_for: frozenset[int] = frozenset(),
    ) -> StepLogits:
        self._prepare(chunks)
        replayed = self._replay(chunks, block_copies, full_logits_for)
        if replayed is not None:
            return replayed
        return self._dispatch(self._inputs(chunks, block_copies, full_logits_for))

    @torch.inference_mode()
    def run(self, step: StepInputs) -> StepLogits:
        """One forward over a step's inputs (every rank of a tensor-parallel group runs it)."""
        if step.block_copies:
            copy_blocks(self.kv_caches, step.block_copies, self.device)
        if not step.ids:  # e.g. only encoder-region chunks that do not complete it
            return StepLogits(torch.empty(0, self.vocab_size, device=self.device), {})
        hidden = self._hidden(step)  # [T, hidden]
        rows = hidden
        if len(step.sample_rows) != len(step.ids):
            rows = hidden[to_device(step.sample_rows, torch.int64, self.device)]
        sampling = self._cut(self._logits(rows))
        # Prompt logprobs: the model's own LM head over every new row, whatever the path.
        starts = step.row_starts
        all_rows = {
            i: self.model.compute_logits(hidden[starts[i] : starts[i] + step.query_lens[i]])
            for i in step.full_logits_for
        }
        return StepLogits(sampling=sampling, all_rows=all_rows)

    def _cut(self, logits: torch.Tensor) -> torch.Tensor:
        return logits if self.sampleable_vocab is None else logits[:, : self.sampleable_vocab]

    # ----- what a runner fills in ----------------------------------------------------------
    def _prepare(self, chunks: Sequence[Any]) -> None:
        """Before the step's inputs are built (default: nothing)."""

    def _replay(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]],
        full_logits_for: frozenset[int],
    ) -> StepLogits | None:
        """A step served some other way (a captured decode graph); None: run it."""
        return None

    def _dispatch(self, step: StepInputs) -> StepLogits:
        return self.run(step)

    def _inputs(
        self,
        chunks: Sequence[Any],
        block_copies: Sequence[tuple[int, int]],
        full_logits_for: frozenset[int],
    ) -> StepInputs:
        raise NotImplementedError

    def _hidden(self, step: StepInputs) -> torch.Tensor:
        """[T, hidden]: the model's last hidden state of every row of the step."""
        raise NotImplementedError

    def _logits(self, rows: torch.Tensor) -> torch.Tensor:
        """[R, hidden] -> [R, padded vocab] float32."""
        return self.model.compute_logits(rows)


def copy_blocks(kv_caches, copies: Sequence[tuple[int, int]], device: torch.device) -> None:
    """Copy-on-write: a sharer about to write into a shared block got a fresh copy of it."""
    src = to_device([s for s, _ in copies], torch.int64, device)
    dst = to_device([d for _, d in copies], torch.int64, device)
    for k_cache, v_cache in kv_caches:
        k_cache.index_copy_(0, dst, k_cache[src])
        v_cache.index_copy_(0, dst, v_cache[src])
