"""PrefillBudget: how many prefill tokens one step can still take, in tokens and in time.

Contract: one `PrefillBudget` per `Scheduler.schedule()`, made after the decodes are placed.
- `tokens_left`: the step's token budget (`max_num_batched_tokens`) minus what is placed.
- The time window: a step that delivers a token to someone (a decode, or the last chunk of a
  prompt) is held to `target_s`, predicted by the `StepCostModel` from the rows and query x key
  pairs already placed. A step in which nobody receives a token (long prompts only) is bounded
  by the token budget alone, so prefill then fills the largest budget.
- `fit(start, want, floor)`: the chunk size for a prefill of `want` tokens from position `start`;
  `floor` tokens are granted even past the window (so prefill always progresses, also when the
  decodes alone exceed the target). `take(start, n, delivers)` places a chunk.
Without a target only the token budget applies. With one, before the cost model is `ready`
(a fresh server), a step that delivers a token takes at most `COLD_PREFILL_TOKENS` prefill
tokens (floors aside): an unfitted model cannot size a chunk, and a full-budget chunk in a
decoding step is an inter-token gap of seconds on a CPU; the steps that deliver nothing still
fill the budget, so the model learns from both sizes.
Pure Python (no torch, no clock).
"""

from __future__ import annotations

from engine.scheduling.step_cost import StepCostModel, chunk_pairs

# Prefill tokens a step that delivers a token may take before the cost model is fitted: a few
# short prompts (a burst of them is admitted together), a fraction of a second on a CPU.
COLD_PREFILL_TOKENS = 256


class PrefillBudget:
    def __init__(
        self,
        tokens_left: int,
        target_s: float | None,
        cost: StepCostModel | None,
        rows: int,
        pairs: int,
        delivers: bool,
    ) -> None:
        self.tokens_left = tokens_left
        self.target_s = target_s if cost is not None else None
        self.cost = cost
        self.rows, self.pairs = rows, pairs  # placed so far (decodes included)
        self.windowed = delivers and self.target_s is not None
        self.prefill_tokens = 0

    def fit(self, start: int, want: int, floor: int = 0) -> int:
        n = min(want, self.tokens_left)
        if n <= 0:
            return 0
        if self.windowed:
            assert self.cost is not None and self.target_s is not None
            if not self.cost.ready:  # still learning (see the module docstring)
                n = min(n, max(0, COLD_PREFILL_TOKENS - self.prefill_tokens))
            else:
                n = self.cost.max_chunk(self.rows, self.pairs, start, n, self.target_s)
        return max(n, min(floor, want, self.tokens_left))

    def take(self, start: int, n: int, delivers: bool) -> None:
        self.tokens_left -= n
        self.rows += n
        self.pairs += chunk_pairs(start, n)
        self.prefill_tokens += n
        if delivers and self.target_s is not None:
            self.windowed = True

    def hold(self, n: int) -> None:
        """Keeps `n` tokens back (a reservation); `release(n)` returns them."""
        self.tokens_left -= n

    def release(self, n: int) -> None:
        self.tokens_left += n
