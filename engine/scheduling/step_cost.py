"""StepCostModel: the predicted seconds of one engine step, fitted online from timed steps.

Model (three non-negative coefficients):
    seconds = fixed + per_row * rows + per_pair * pairs
    rows  = tokens through the linears this step (decode tokens + prefill chunk tokens)
    pairs = query x key pairs through attention; a chunk of n tokens starting at position s
            attends causally to s+1 .. s+n keys: `chunk_pairs(s, n) = n*s + n*(n+1)/2`
Fit: least squares weighted by recency (each new step multiplies the old weights by `decay`,
since the machine's speed drifts), with every coefficient >= 0 (the best of the 7 active sets,
solved on the 3x3 normal equations), so no fit ever promises a free row or a free pair. The
last fit's active set is tried first and kept when it is still optimal (the KKT conditions:
its solution >= 0, no coefficient held at 0 that would lower the loss by growing): in the
steady state the set stays, and one refit costs two solves instead of seven (issue 38).
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
        self._active: tuple[int, ...] = _SUBSETS[-1]  # the free coefficients of the last fit

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
        x, decay, xy = (1.0, rows * _ROW_SCALE, pairs * _PAIR_SCALE), self.decay, self._xy
        for i, (xx_i, x_i) in enumerate(zip(self._xx, x, strict=True)):
            xy[i] = decay * xy[i] + x_i * seconds
            xx_i[0] = decay * xx_i[0] + x_i * x[0]
            xx_i[1] = decay * xx_i[1] + x_i * x[1]
            xx_i[2] = decay * xx_i[2] + x_i * x[2]
        self.num_samples += 1
        if rows >= self.max_rows_seen:
            self.rough_per_row = seconds / rows
        self.max_rows_seen = max(self.max_rows_seen, rows)
        theta, self._active = _non_negative_fit(self._xx, self._xy, self._active)
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


def _non_negative_fit(
    xx: list[list[float]], xy: list[float], warm: tuple[int, ...] = _SUBSETS[-1]
) -> tuple[list[float], tuple[int, ...]]:
    """argmin ||y - X theta||^2 over theta >= 0 from the normal equations, and its free set:
    the unconstrained solution when it is >= 0 (then no constrained one does better; one solve
    instead of seven: a step's `observe` 62 -> 22 us on a mix of decode and prefill steps), else
    the solution on the `warm` set (the last fit's) when the KKT conditions say it is optimal,
    else the best of the solutions on each subset of free coefficients whose values are >= 0."""
    full = _subset_solution(xx, xy, _SUBSETS[-1])
    if full is not None:
        return full, _SUBSETS[-1]
    theta = _subset_solution(xx, xy, warm) if 0 < len(warm) < 3 else None
    if theta is not None and _optimal(xx, xy, theta, warm):
        return theta, warm
    best, best_loss, best_set = [0.0, 0.0, 0.0], 0.0, ()  # theta = 0: loss - sum(w y^2) is 0
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
            best, best_loss, best_set = theta, loss, subset
    return best, best_set


def _optimal(xx: list[list[float]], xy: list[float], theta: list[float], free: tuple) -> bool:
    """The KKT conditions of the non-negative fit at `theta` (>= 0, solved on `free`): the
    loss's gradient 2 (XX theta - Xy) is >= 0 for every coefficient held at 0, so none can
    grow and lower the loss; the loss is convex, so then `theta` is the minimum."""
    for i in range(3):
        if i not in free:
            row = xx[i]
            if row[0] * theta[0] + row[1] * theta[1] + row[2] * theta[2] < xy[i]:
                return False
    return True


def _subset_solution(
    xx: list[list[float]], xy: list[float], subset: tuple[int, ...]
) -> list[float] | None:
    """The least-squares theta with only `subset` free (the others 0), a tiny ridge on the
    diagonal; None when singular or when a free coefficient comes out negative."""
    a = [[row[j] for j in subset] for row in [xx[i] for i in subset]]
    trace = 0.0
    for k, row in enumerate(a):
        trace += row[k]
    ridge = 1e-9 * (trace + 1e-12)
    for k, row in enumerate(a):
        row[k] += ridge
    sol = _solve(a, [xy[i] for i in subset])
    if sol is None or min(sol) < 0:
        return None
    if len(subset) == 3:
        return sol
    theta = [0.0, 0.0, 0.0]
    for i, v in zip(subset, sol, strict=True):
        theta[i] = v
    return theta


def _solve(a: list[list[float]], b: list[float]) -> list[float] | None:
    """Gaussian elimination with partial pivoting of a 1x1, 2x2 or 3x3 system, unrolled (the
    same operations in the same order as the textbook loops, so the same bits: the loops cost
    ~19 us a 3x3 solve, up to seven solves a step, issue 38); None when singular."""
    n = len(b)
    if n == 1:
        return None if abs(a[0][0]) < 1e-300 else [b[0] / a[0][0]]
    if n == 2:  # as a 3x3 system with an identity third row: the 2x2's operations and bits
        sol = _solve([[*a[0], 0.0], [*a[1], 0.0], [0.0, 0.0, 1.0]], [*b, 0.0])
        return None if sol is None else sol[:2]
    r0, r1, r2 = [*a[0], b[0]], [*a[1], b[1]], [*a[2], b[2]]
    if abs(r1[0]) > abs(r0[0]):  # the first row of the largest magnitude in column 0
        if abs(r2[0]) > abs(r1[0]):
            r0, r2 = r2, r0
        else:
            r0, r1 = r1, r0
    elif abs(r2[0]) > abs(r0[0]):
        r0, r2 = r2, r0
    p0 = r0[0]
    if abs(p0) < 1e-300:
        return None
    r1, r2 = _eliminated(r1, r0, 0), _eliminated(r2, r0, 0)
    if abs(r2[1]) > abs(r1[1]):
        r1, r2 = r2, r1
    p1 = r1[1]
    if abs(p1) < 1e-300:
        return None
    _, _, p2, b2 = _eliminated(r2, r1, 1)
    if abs(p2) < 1e-300:
        return None
    x2 = b2 / p2
    x1 = (r1[3] - r1[2] * x2) / p1
    return [(r0[3] - (r0[1] * x1 + r0[2] * x2)) / p0, x1, x2]


def _eliminated(row: list[float], top: list[float], col: int) -> list[float]:
    """`row` less the multiple of `top` that clears its column `col` (an augmented 3x3 row)."""
    f = row[col] / top[col]
    return [0.0] * (col + 1) + [row[c] - f * top[c] for c in range(col + 1, 4)]
