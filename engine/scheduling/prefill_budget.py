"""PrefillBudget: how many prefill tokens one step can still take, in tokens and in time.

Contract: one `PrefillBudget` per `Scheduler.schedule()`, made after the decodes are placed.
- `tokens_left`: the step's token budget (`max_num_batched_tokens`) minus what is placed.
- The time window: a step that delivers a token to a streamed request (a decode, or the last
  chunk of a prompt, of a request whose `SamplingParams.streamed` is set) is held to `target_s`,
  predicted by the `StepCostModel` from the rows and query x key pairs already placed. A step in
  which no stream receives a token (long prompts only, or only whole-output requests: stream
  false, offline batches, which have no inter-token latency to protect) is bounded by the token
  budget alone, so prefill then fills the largest budget.
- `fit(start, want, floor)`: the chunk size for a prefill of `want` tokens from position `start`:
  what the window leaves, at least `floor` tokens. `take(start, n, delivers)` places a chunk.
- `anchor_floor(start, need)`: the anchor's guaranteed chunk, the one prefill that may pass the
  window: `MIN_PREFILL_CHUNK` tokens, shrunk (costed with its attention pairs) to what
  `ANCHOR_WINDOW_SHARE` of the window's slack after the decodes takes, as if the step delivered
  a token (the rest goes to shorter prompts first), but never below `ANCHOR_MIN_CHUNK`. So a
  step with decodes is predicted within the target, floors included, unless the decodes alone
  (nearly) fill it; then only the anchor passes it, by a few tokens, and still progresses every
  step (no starvation). The allotment `hold`s the anchor's floor (tokens, rows and pairs) while
  shorter prompts are served, so they are sized around it.
Without a target only the token budget applies. With one, before the cost model is `ready`
(a fresh server), steps are sized with its `rough_per_row` prior (seconds per row of the largest
step timed: rows x prior within the target), and before any step was timed a step that delivers
a token takes at most `COLD_PREFILL_TOKENS` prefill tokens: an unfitted model cannot size a
chunk, and a full-budget chunk in a decoding step is an inter-token gap of seconds on a CPU; the
steps that deliver nothing still fill the budget, so the model learns from both sizes.
Pure Python (no torch, no clock).
"""

from __future__ import annotations

from engine.scheduling.step_cost import StepCostModel, chunk_pairs

# The anchor's floor while the window has room for it: long prompts progress at least this much
# per step while streams decode.
MIN_PREFILL_CHUNK = 32
# The anchor's floor when the decodes alone (nearly) fill the window: never zero, so the oldest
# prompt progresses every step, and small, so the step passes the target by little.
ANCHOR_MIN_CHUNK = 4
# The anchor's floor takes at most this share of a step's time slack after the decodes, so
# shortest-first still serves short prompts when the decodes leave little room.
ANCHOR_WINDOW_SHARE = 0.25
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
        if n > 0 and self.windowed:
            n = self._in_window(start, n)
        return max(n, min(floor, want, self.tokens_left))

    def anchor_floor(self, start: int, need: int) -> int:
        """The tokens the anchor (`need` left from position `start`) gets this step whatever
        else is placed: sized as if the step delivered a token (see the module docstring)."""
        n = min(MIN_PREFILL_CHUNK, need, self.tokens_left)
        if n > 0 and self.target_s is not None:
            n = self._in_window(start, n, ANCHOR_WINDOW_SHARE)
        return max(n, min(ANCHOR_MIN_CHUNK, need, self.tokens_left))

    def _in_window(self, start: int, n: int, share: float = 1.0) -> int:
        """The most of `n` tokens from position `start` that `share` of the time window's
        slack still takes."""
        cost, target = self.cost, self.target_s
        assert cost is not None and target is not None
        if cost.ready:
            base = cost.predict(self.rows, self.pairs)
            return cost.max_chunk(self.rows, self.pairs, start, n, base + share * (target - base))
        if cost.rough_per_row is not None:  # a fresh server: the prior (module docstring)
            slack = target / cost.rough_per_row - self.rows
        else:
            slack = COLD_PREFILL_TOKENS - self.prefill_tokens
        return min(n, max(0, int(share * slack)))

    def take(self, start: int, n: int, delivers: bool) -> None:
        self.hold(start, n)
        if delivers and self.target_s is not None:
            self.windowed = True

    def hold(self, start: int, n: int) -> None:
        """Keeps a chunk of `n` tokens from position `start` back (tokens, rows and pairs: a
        reservation); `release(start, n)` returns it."""
        self.tokens_left -= n
        self.rows += n
        self.pairs += chunk_pairs(start, n)
        self.prefill_tokens += n

    def release(self, start: int, n: int) -> None:
        self.tokens_left += n
        self.rows -= n
        self.pairs -= chunk_pairs(start, n)
        self.prefill_tokens -= n
