"""PrefillBudget: how many prefill tokens one step can still take, in tokens and in time.

Contract: one `PrefillBudget` per `Scheduler.schedule()`, made after the decodes are placed.
- `tokens_left`: the step's token budget (`max_num_batched_tokens`) minus what is placed.
- The time window: a step that delivers a token to a streamed request (a decode, or the last
  chunk of a prompt, of a request whose `SamplingParams.streamed` is set) is held to `target_s`,
  predicted by the `StepCostModel` from the rows and query x key pairs already placed. A step in
  which no stream receives a token (long prompts only, or only whole-output requests: stream
  false, offline batches, which have no inter-token latency to protect) takes the larger
  `background_s` (`MAX_BACKGROUND_STEP_S`; the target, or `BACKGROUND_OVER_BASE` times the
  step's cost before its prefill, when larger): its prompts fill
  the token budget unless the step would last longer, so a request that arrives meanwhile waits
  for at most a bounded step, and steps this long cost a CPU no throughput (the per-step
  overhead is milliseconds).
- First tokens: once a chunk that completes a prompt is placed (its request's first token, the
  short prompts first, shortest-first), a chunk that would not complete its own prompt gets only
  what the target window leaves: whatever its `stream` setting, nobody's first token waits for
  the middle of a long prompt. Chunks that complete their prompts (an offline batch of equal
  prompts) still fill the step.
- `first_token_floor(want)`: in such a step, the first prompt to complete (the shortest), when
  it needs at most `MIN_PREFILL_CHUNK` tokens, gets them whatever the bound (like the anchor's
  floor: one per step, a few tokens), so a short request arriving behind long prompts is never
  left waiting, even when the cost model says the bound is full.
- `fit(start, want, floor)`: the chunk size for a prefill of `want` tokens from position `start`:
  what the window leaves, at least `floor` tokens. `take(start, n, completes, streamed)` places
  a chunk (`completes`: the prompt's last chunk, whose token is sampled).
- `anchor_floor(start, need)`: the anchor's guaranteed chunk, the one prefill that may pass the
  window: `MIN_PREFILL_CHUNK` tokens, shrunk (costed with its attention pairs) to what
  `ANCHOR_WINDOW_SHARE` of the window's slack after the decodes takes, as if the step delivered
  a token (the rest goes to shorter prompts first), but never below `ANCHOR_MIN_CHUNK`. So a
  step with decodes is predicted within the target, floors included, unless the decodes alone
  (nearly) fill it; then only the anchor passes it, by a few tokens, and still progresses every
  step (no starvation). The allotment `hold`s the anchor's floor (tokens, rows and pairs) while
  shorter prompts are served, so they are sized around it.
- A lone prompt (`alone()`: nothing placed before it, no other prompt waiting or prefilling)
  gets the whole token budget whatever the target: nobody's latency is at stake, and under CPU
  contention the 1 s bound cut a lone 1,500-token prompt into 45 steps (95 s against 20-27 s
  in one step; issue 39).
- In a step no stream is held to the target, the anchor's floor is also the amortised chunk:
  the tokens that cost what the step does before its prefill (its fixed part, `BACKGROUND_OVER_
  BASE` - 1 times it), so however slow the machine, a step's fixed cost is shared by a chunk
  that large, also when a short prompt's first token then holds the rest of the step to the
  target.
Without a target only the token budget applies. With one, before the cost model is `ready`
(a fresh server), steps are sized with its `rough_per_row` prior (seconds per row of the largest
step timed: rows x prior within the target), and before any step was timed a step that delivers
a token takes at most `COLD_PREFILL_TOKENS` prefill tokens: an unfitted model cannot size a
chunk, and a full-budget chunk in a decoding step is an inter-token gap of seconds on a CPU; the
steps that deliver nothing still fill the budget (no bound before a step was timed), so the
model learns from both sizes.
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
# The longest a step in which no stream receives a token may last (predicted): what a request
# arriving meanwhile may have to wait before its own step starts.
MAX_BACKGROUND_STEP_S = 1.0
# ... or this many times what the step costs before its prefill (its fixed part and decodes), when
# that is more: where a step cannot be that short anyway (a slow or busy machine), prefill still
# takes a fair share of it instead of stalling at the floors.
BACKGROUND_OVER_BASE = 2.0


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
        self.background_s: float | None = None
        if self.target_s is not None:
            base = cost.predict(rows, pairs) if cost is not None and cost.ready else 0.0
            self.background_s = max(
                MAX_BACKGROUND_STEP_S, self.target_s, BACKGROUND_OVER_BASE * base
            )
        self.first_token = False  # a chunk placed completes a prompt
        self.prefill_tokens = 0

    def fit(self, start: int, want: int, floor: int = 0) -> int:
        n = min(want, self.tokens_left)
        if n > 0 and self.target_s is not None:
            if self.windowed:
                n = self._in_window(start, n, self.target_s)
            else:
                n = self._in_window(start, n, self.background_s, background=True)
                if n < want and self.first_token:  # the middle of a prompt: after first tokens
                    n = self._in_window(start, n, self.target_s)
        return max(n, min(floor, want, self.tokens_left))

    def alone(self) -> None:
        """The step's one prompt, with nothing else in the step or waiting: the token budget
        alone bounds it (module docstring)."""
        self.target_s = None
        self.windowed = False

    def first_token_floor(self, want: int) -> int:
        """The tokens a prompt that `want`s at most `MIN_PREFILL_CHUNK` more to complete gets
        whatever the bound, in a step no stream holds to the target, when it is the first to
        complete in the step (the shortest, in prefill order): a newly arrived short request
        is scheduled in the next step even when long prompts fill the bound."""
        if self.windowed or self.first_token or want > MIN_PREFILL_CHUNK:
            return 0
        return min(want, self.tokens_left)

    def anchor_floor(self, start: int, need: int) -> int:
        """The tokens the anchor (`need` left from position `start`) gets this step whatever
        else is placed: sized as if the step delivered a token (see the module docstring)."""
        n = min(MIN_PREFILL_CHUNK, need, self.tokens_left)
        if n > 0 and self.target_s is not None:
            n = self._in_window(start, n, self.target_s, ANCHOR_WINDOW_SHARE)
            if not self.windowed:  # nobody's inter-token gap at stake (yet)
                n = max(n, self._amortised(start, need))
        return max(n, min(ANCHOR_MIN_CHUNK, need, self.tokens_left))

    def _amortised(self, start: int, need: int) -> int:
        """The chunk from `start` whose predicted cost is `BACKGROUND_OVER_BASE` - 1 times the
        step's cost before it (0 before the cost model is fitted)."""
        cost = self.cost
        if cost is None or not cost.ready:
            return 0
        base = cost.predict(self.rows, self.pairs)
        want = min(need, self.tokens_left)
        return cost.max_chunk(self.rows, self.pairs, start, want, BACKGROUND_OVER_BASE * base)

    def _in_window(
        self, start: int, n: int, limit_s: float, share: float = 1.0, background: bool = False
    ) -> int:
        """The most of `n` tokens from position `start` that `share` of the slack left before
        `limit_s` still takes (`background`: the loose bound, none before a step was timed)."""
        cost = self.cost
        assert cost is not None
        if cost.ready:
            base = cost.predict(self.rows, self.pairs)
            return cost.max_chunk(self.rows, self.pairs, start, n, base + share * (limit_s - base))
        if cost.rough_per_row is not None:  # a fresh server: the prior (module docstring)
            slack = limit_s / cost.rough_per_row - self.rows
        elif background:
            return n
        else:
            slack = COLD_PREFILL_TOKENS - self.prefill_tokens
        return min(n, max(0, int(share * slack)))

    def take(self, start: int, n: int, completes: bool, streamed: bool) -> None:
        """Places a chunk of `n` tokens from `start`; `completes`: the prompt's last (a token
        is sampled), `streamed`: for a request that reads it as a stream."""
        self.hold(start, n)
        if completes:
            self.first_token = True
            if streamed and self.target_s is not None:
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
