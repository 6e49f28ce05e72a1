"""Computing a step's grammar masks on a worker thread while the forward runs.

Contract: `GrammarMasker(vocab_size)`; `start(jobs)` takes `(logits_row, matcher)` pairs — the
rows of the coming step that sample under a grammar, each with its sequence's llguidance
matcher — and returns a `PendingMask` at once; its `result()` (after the forward) is the step's
`TokenMask` (token_mask.py), or None when no row is constrained. Between `start` and `result`
the caller must not touch those matchers (the engine runs only the forward meanwhile).
The forward releases the GIL (the C++ step and torch ops do), and so do llguidance's mask
computation and numpy's unpacking, so the two overlap on separate cores; the masks cost the
step only what is left of them when the forward ends. `close()` stops the thread.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor

import llguidance
import numpy as np

from engine.sampling.token_mask import TokenMask, allowed_tokens, bitmask_words


class PendingMask:
    def __init__(self, future: Future | None) -> None:
        self._future = future

    def result(self) -> TokenMask | None:
        return None if self._future is None else self._future.result()


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
        return PendingMask(self._pool.submit(self.compute, list(jobs)))

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

    def close(self) -> None:
        self._pool.shutdown(wait=True)
