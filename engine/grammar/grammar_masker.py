"""Computing a step's grammar masks on a worker thread while the forward runs.

Contract: `GrammarMasker(vocab_size)`; `start(jobs)` takes `(logits_row, matcher)` pairs — the
rows of the coming step that sample under a grammar, each with its sequence's llguidance
matcher — and returns a `PendingMask` at once; its `result()` (the runner calls it after its
forward) is the step's `HostMask` (host_mask.py: host data, no tensors), or None when no row is
constrained; later calls return the same. Between `start` and `result`
the caller must not touch those matchers (the engine runs only the forward meanwhile).
The forward releases the GIL (the C++ step and torch ops do), and so do llguidance's mask
computation and numpy's unpacking, so the two overlap on separate cores; the masks cost the
step only what is left of them when the forward ends. If the batched computation raises,
`result()` computes the rows one at a time (`compute_each`) and names the ones that still
raise as the mask's `failed` rows, so one request's grammar fails that request alone.
`close()` stops the thread.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from functools import partial

import llguidance
import numpy as np

from engine.grammar.host_mask import HostMask, bitmask_words, unpack_bitmask

log = logging.getLogger("tgserve.engine")


class PendingMask:
    def __init__(
        self,
        future: Future | None,
        redo: Callable[[], HostMask] | None = None,
        failed: Sequence[int] = (),
        vocab_size: int = 0,
    ) -> None:
        self._future = future
        self._redo = redo
        self._failed = tuple(failed)  # rows whose matcher raised before the masks started
        self._vocab_size = vocab_size
        self._done = False
        self._mask: HostMask | None = None

    def result(self) -> HostMask | None:
        if not self._done:
            self._mask, self._done = self._wait(), True
        return self._mask

    def _wait(self) -> HostMask | None:
        mask = None
        if self._future is not None:
            try:
                mask = self._future.result()
            except Exception:  # one row's matcher broke the batch: each row alone, here
                log.exception("a step's grammar masks failed; computing them row by row")
                mask = self._redo()
        if not self._failed:
            return mask
        if mask is None:
            return HostMask.empty(self._vocab_size, self._failed)
        return mask.with_failed(self._failed)


class GrammarMasker:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._words = bitmask_words(vocab_size)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tgserve-grammar")
        # llguidance's own pool spreads the rows over cores (its default: ~80% of them).
        self._executor = llguidance.LLExecutor()

    def start(
        self, jobs: Sequence[tuple[int, llguidance.LLMatcher]], failed: Sequence[int] = ()
    ) -> PendingMask:
        """`failed`: logits rows whose matcher already raised (named in the mask's `failed`)."""
        if not jobs:
            return PendingMask(None, failed=failed, vocab_size=self.vocab_size)
        jobs = list(jobs)
        future = self._pool.submit(self.compute, jobs)
        return PendingMask(future, partial(self.compute_each, jobs), failed, self.vocab_size)

    def compute(self, jobs: list[tuple[int, llguidance.LLMatcher]]) -> HostMask:
        """The masks of `jobs` now, on the calling thread (what the worker runs)."""
        jobs = sorted(jobs, key=lambda job: job[0])
        bitmask = np.empty((len(jobs), self._words), dtype=np.int32)
        self._executor.unsafe_compute_mask_ptr(
            [(matcher, g) for g, (_, matcher) in enumerate(jobs)],
            bitmask.ctypes.data,
            self._words * 4,
            len(jobs),
        )
        return HostMask(tuple(row for row, _ in jobs), unpack_bitmask(bitmask, self.vocab_size))

    def compute_each(self, jobs: list[tuple[int, llguidance.LLMatcher]]) -> HostMask:
        """The masks of `jobs` one at a time: a job that raises becomes a `failed` row."""
        masks, failed = [], []
        for job in sorted(jobs, key=lambda job: job[0]):
            try:
                masks.append(self.compute([job]))
            except Exception:
                log.exception("the grammar mask of logits row %d failed", job[0])
                failed.append(job[0])
        rows = tuple(row for mask in masks for row in mask.rows)
        allowed = [mask.allowed for mask in masks]
        if not allowed:
            return HostMask.empty(self.vocab_size, failed)
        return HostMask(rows, np.concatenate(allowed), tuple(failed))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
