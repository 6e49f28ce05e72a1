"""Computing a step's grammar masks on a worker thread while the forward runs.

Contract: `GrammarMasker(vocab_size)`; `start(jobs)` takes `(logits_row, matcher)` pairs — the
rows of the coming step that sample under a grammar, each with its sequence's llguidance
matcher — and returns a `PendingMask` at once; its `result()` (after the forward) is the step's
`TokenMask` (token_mask.py), or None when no row is constrained. Between `start` and `result`
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
import torch

from engine.sampling.token_mask import TokenMask, allowed_tokens, bitmask_words

log = logging.getLogger("tgserve.engine")


class PendingMask:
    def __init__(
        self,
        future: Future | None,
        redo: Callable[[], TokenMask] | None = None,
    ) -> None:
        self._future = future
        self._redo = redo

    def result(self) -> TokenMask | None:
        if self._future is None:
            return None
        try:
            return self._future.result()
        except Exception:  # one row's matcher broke the batch: each row alone, on this thread
            log.exception("a step's grammar masks failed; computing them row by row")
            return self._redo()


class GrammarMasker:
    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self._words = bitmask_words(vocab_size)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="tgserve-grammar")
        # llguidance's own pool spreads the rows over cores (its default: ~80% of them).
        self._executor = llguidance.LLExecutor()

    def start(self, jobs: Sequence[tuple[int, llguidance.LLMatcher]]) -> PendingMask:
        if not jobs:
            return PendingMask(None)
        jobs = list(jobs)
        return PendingMask(self._pool.submit(self.compute, jobs), partial(self.compute_each, jobs))

    def compute(self, jobs: list[tuple[int, llguidance.LLMatcher]]) -> TokenMask:
        """The masks of `jobs` now, on the calling thread (what the worker runs)."""
        jobs = sorted(jobs, key=lambda job: job[0])
        bitmask = np.empty((len(jobs), self._words), dtype=np.int32)
        self._executor.unsafe_compute_mask_ptr(
            [(matcher, g) for g, (_, matcher) in enumerate(jobs)],
            bitmask.ctypes.data,
            self._words * 4,
            len(jobs),
        )
        return TokenMask(tuple(row for row, _ in jobs), allowed_tokens(bitmask, self.vocab_size))

    def compute_each(self, jobs: list[tuple[int, llguidance.LLMatcher]]) -> TokenMask:
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
        empty = torch.zeros(0, self.vocab_size, dtype=torch.bool)
        return TokenMask(rows, torch.cat(allowed) if allowed else empty, tuple(failed))

    def close(self) -> None:
        self._pool.shutdown(wait=True)
