"""StepCostModel: the predicted seconds of one engine step, fitted online from timed steps.

Model (three non-negative coefficients):
    seconds = fixed + per_row * rows + per_pair * pairs
    rows  = tokens through the linears this step (decode tokens + prefill chunk tokens)
    pairs = query x key pairs through attention; a chunk of n tokens starting at position s
            attends causally to s+1 .. s+n keys: `chunk_pairs(s, n) = n*s + n*(n+1)/2`
Fit: least squares weighted by recency (each new step multiplies the old weights by `decay`,
since the machine's speed drifts), with every coefficient >= 0 (the best of the 7 active sets,
solved on the 3x3 normal equations), so no fit ever promises a free row or a free pair.
Until `min_samples` steps were observed `ready` is False; meanwhile `rough_per_row` (seconds per
row of the largest step timed so far: its fixed part spread over its rows) is a prior a caller
may size steps with, and None before the first step.
Trust region: `max_chunk` never proposes a step larger than `growth` times the largest step
(in rows) ever timed, so a fit made from small steps is not extrapolated far; every step the
budget allows teaches the model, so the region grows as fast as the traffic needs.
A timing more than `outlier_factor` times the prediction (a GC pause, a noisy neighbour) is
clipped to that bound before it is learned. Pure Python: no torch, no clock (the engine times).
"""

from __future__ import annotations

import itertools
import math

_ROW_SCALE = 1e-3  # features in thousands of rows and millions of pairs: a well-conditioned fit
_PAIR_SCALE = 1e-6
_SUBSETS = [s for k in (1, 2, 3) for s in itertools.combinations(range(3), k)]


def chunk_pairs(start: int, num_tokens: int) -> int:
    """Query x key pairs of a causal chunk of `num_tokens` tokens from position `start`."""
    return num_tokens * start + num_tokens * (num_tokens + 1) // 2


class StepCostModel:
    def __init__(
        self,
        decay: float = 0.97,
        min_samples: int = 8,
        growth: float = 2.0,
        outlier_factor: float = 4.0,
    ) -> None:
        if not 0.0 < decay <= 1.0:
            raise ValueError(f"decay must be in (0, 1], got {decay}")
        self.decay = decay
        self.min_samples = min_samples
        self.growth = growth
        self.outlier_factor = outlier_factor
        self._xx = [[0.0] * 3 for _ in range(3)]  # sum of w * x x^T, x = (1, rows, pairs) scaled
        self._xy = [0.0] * 3  # sum of w * x * seconds
        self.num_samples = 0
        self.max_rows_seen = 0
        self.rough_per_row: float | None = None
        self.coefficients = (0.0, 0.0, 0.0)  # fixed s, s per row, s per pair (unscaled)

    @property
    def ready(self) -> bool:
        return self.num_samples >= self.min_samples

    def predict(self, rows: int, pairs: int) -> float:
        fixed, per_row, per_pair = self.coefficients
        return fixed + per_row * rows + per_pair * pairs

    def observe(self, rows: int, pairs: int, seconds: float) -> None:
        """Learns one timed step."""
        if rows < 1 or not math.isfinite(seconds) or seconds < 0:
            return
        if self.ready:  # clip, so one stall does not teach the model that every step is slow
            seconds = min(seconds, self.outlier_factor * max(self.predict(rows, pairs), 1e-4))
        x, decay = (1.0, rows * _ROW_SCALE, pairs * _PAIR_SCALE), self.decay
        for xx_i, x_i, i in zip(self._xx, x, range(3), strict=True):
            self._xy[i] = decay * self._xy[i] + x_i * seconds
            xx_i[:] = [decay * a + x_i * x_j for a, x_j in zip(xx_i, x, strict=True)]
        self.num_samples += 1
        if rows >= self.max_rows_seen:
            self.rough_per_row = seconds / rows
        self.max_rows_seen = max(self.max_rows_seen, rows)
        theta = _non_negative_fit(self._xx, self._xy)
        self.coefficients = (theta[0], theta[1] * _ROW_SCALE, theta[2] * _PAIR_SCALE)

    def trusted_rows(self) -> int:
        """The largest step (rows) the model may be asked about."""
        return max(1, int(self.growth * self.max_rows_seen))

    def max_chunk(self, rows: int, pairs: int, start: int, want: int, seconds: float) -> int:
        """The most tokens (<= want) of a chunk from position `start` that a step already
        holding `rows` rows and `pairs` pairs can add and still be predicted to end within
        `seconds`; 0 when not even one fits."""
        want = min(want, self.trusted_rows() - rows)
        if want <= 0:
            return 0
        _, per_row, per_pair = self.coefficients
        slack = seconds - self.predict(rows, pairs)
        if slack <= 0:
            return 0
        # per_pair/2 n^2 + (per_row + per_pair (start + 1/2)) n <= slack
        a, b = per_pair / 2, per_row + per_pair * (start + 0.5)
        if a > 0:
            n = (-b + math.sqrt(b * b + 4 * a * slack)) / (2 * a)
        elif b > 0:
            n = slack / b
        else:
            return want
        return max(0, min(want, int(n)))


def _non_negative_fit(xx: list[list[float]], xy: list[float]) -> list[float]:
    """argmin ||y - X theta||^2 over theta >= 0 from the normal equations: the unconstrained
    solution when it is >= 0 (then no constrained one does better; one solve instead of seven:
    a step's `observe` 62 -> 22 us on a mix of decode and prefill steps), else the best of the
    solutions on each subset of free coefficients whose values are all >= 0."""
    full = _subset_solution(xx, xy, _SUBSETS[-1])
    if full is not None:
        return full
    best, best_loss = [0.0, 0.0, 0.0], 0.0  # theta = 0: loss relative to sum(w y^2) is 0
    for subset in _SUBSETS[:-1]:  # (all three free: no solution >= 0, just seen)
        theta = _subset_solution(xx, xy, subset)
        if theta is None:
            continue
        # loss - sum(w y^2) = theta' XX theta - 2 theta' Xy, over the free ones (the others'
        # terms are 0; plain loops: this runs after every step, generators cost more here)
        quad = linear = 0.0
        for i in subset:
            for j in subset:
                quad += theta[i] * xx[i][j] * theta[j]
            linear += theta[i] * xy[i]
        loss = quad - 2 * linear
        if loss < best_loss:
            best, best_loss = theta, loss
    return best


def _subset_solution(
    xx: list[list[float]], xy: list[float], subset: tuple[int, ...]
) -> list[float] | None:
    """The least-squares theta with only `subset` free (the others 0), a tiny ridge on the
    diagonal; None when singular or when a free coefficient comes out negative."""
    a = [[xx[i][j] for j in subset] for i in subset]
    trace = 0.0
    for k in range(len(subset)):
        trace += a[k][k]
    ridge = 1e-9 * (trace + 1e-12)
    for k in range(len(subset)):
        a[k][k] += ridge
    sol = _solve(a, [xy[i] for i in subset])
    if sol is None or min(sol) < 0:
        return None
    theta = [0.0, 0.0, 0.0]
    for i, v in zip(subset, sol, strict=True):
        theta[i] = v
    return theta


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting; None when singular."""
    n = len(b)
    m = [row[:] + [b[i]] for i, row in enumerate(a)]
    for col in range(n):
        pivot = col  # the first row of the largest magnitude in the column
        for r in range(col + 1, n):
            if abs(m[r][col]) > abs(m[pivot][col]):
                pivot = r
        if abs(m[pivot][col]) < 1e-300:
            return None
        m[col], m[pivot] = m[pivot], m[col]
        for r in range(col + 1, n):
            f = m[r][col] / m[col][col]
            for c in range(col, n + 1):
                m[r][c] -= f * m[col][c]
    x = [0.0] * n
    for r in range(n - 1, -1, -1):
        known = 0.0
        for c in range(r + 1, n):
            known += m[r][c] * x[c]
        x[r] = (m[r][n] - known) / m[r][r]
    return x
