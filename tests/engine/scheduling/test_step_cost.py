"""StepCostModel: the online fit recovers the coefficients of synthetic step timings, never
goes negative, sizes chunks to the largest that fits (checked against a brute-force search),
stays inside its trust region and is not thrown off by one stalled step; its unrolled solver
agrees with numpy's on the 1x1-3x3 systems the fit solves.
"""

from __future__ import annotations

import itertools
import random

import numpy as np
import pytest

from engine.scheduling.step_cost import StepCostModel, _solve, chunk_pairs

TRUE = (0.012, 0.0004, 0.0000015)  # fixed s, s per row, s per query x key pair


def true_seconds(rows: int, pairs: int) -> float:
    return TRUE[0] + TRUE[1] * rows + TRUE[2] * pairs


def synthetic_steps(rng: random.Random, count: int) -> list[tuple[int, int]]:
    """(rows, pairs) of mixed steps: decodes over contexts of up to 1,000 plus prefill chunks."""
    steps = []
    for _ in range(count):
        decodes = rng.randrange(0, 32)
        rows = decodes + (chunk := rng.randrange(0, 512))
        if rows == 0:
            continue
        start = rng.randrange(0, 1024)
        pairs = sum(rng.randrange(1, 1000) for _ in range(decodes)) + chunk_pairs(start, chunk)
        steps.append((rows, pairs))
    return steps


def test_chunk_pairs_counts_causal_query_key_pairs():
    assert chunk_pairs(0, 1) == 1
    assert chunk_pairs(0, 4) == 1 + 2 + 3 + 4
    assert chunk_pairs(10, 3) == 11 + 12 + 13
    assert chunk_pairs(7, 0) == 0


def test_the_fit_recovers_the_coefficients_of_noisy_synthetic_timings():
    rng = random.Random(0)
    model = StepCostModel(decay=0.995)
    for rows, pairs in synthetic_steps(rng, 400):
        model.observe(rows, pairs, true_seconds(rows, pairs) * rng.uniform(0.97, 1.03))
    assert model.ready
    for got, want in zip(model.coefficients, TRUE, strict=True):
        assert got == pytest.approx(want, rel=0.15)
    for rows, pairs in synthetic_steps(rng, 50):
        assert model.predict(rows, pairs) == pytest.approx(true_seconds(rows, pairs), rel=0.05)


def test_the_fit_follows_a_machine_that_slows_down():
    rng = random.Random(1)
    model = StepCostModel(decay=0.9)
    for rows, pairs in synthetic_steps(rng, 100):
        model.observe(rows, pairs, true_seconds(rows, pairs))
    for rows, pairs in synthetic_steps(rng, 100):  # a neighbour takes half the machine
        model.observe(rows, pairs, 2 * true_seconds(rows, pairs))
    assert model.predict(256, 100_000) == pytest.approx(2 * true_seconds(256, 100_000), rel=0.05)


def test_coefficients_stay_non_negative_when_timings_suggest_otherwise():
    model = StepCostModel()
    for rows in range(1, 40):  # bigger steps measured faster: least squares alone goes < 0
        model.observe(rows, rows * 10, 0.05 - 0.0005 * rows)
    assert all(c >= 0 for c in model.coefficients)
    assert model.predict(1, 10) > 0


def test_not_ready_before_min_samples():
    model = StepCostModel(min_samples=8)
    for i in range(7):
        model.observe(10 + i, 100, 0.02)
    assert not model.ready
    model.observe(20, 100, 0.02)
    assert model.ready


def fitted(decay: float = 0.99) -> StepCostModel:
    model = StepCostModel(decay=decay)
    for rows, pairs in synthetic_steps(random.Random(2), 300):
        model.observe(rows, pairs, true_seconds(rows, pairs))
    return model


@pytest.mark.parametrize(
    ("rows", "pairs", "start", "target"),
    [(32, 20_000, 0, 0.1), (32, 20_000, 900, 0.1), (8, 1_000, 0, 0.3), (64, 60_000, 300, 0.05)],
)
def test_max_chunk_is_the_largest_chunk_predicted_within_the_target(rows, pairs, start, target):
    model = fitted()
    n = model.max_chunk(rows, pairs, start, want=2048, seconds=target)

    def fits(k: int) -> bool:
        return model.predict(rows + k, pairs + chunk_pairs(start, k)) <= target + 1e-12

    brute = max((k for k in range(0, 2049) if fits(k)), default=0)
    brute = min(brute, model.trusted_rows() - rows)
    assert n == max(0, brute)


def test_max_chunk_is_zero_when_the_step_is_already_over_target():
    model = fitted()
    assert model.max_chunk(2000, 10**7, 0, want=100, seconds=0.05) == 0


def test_max_chunk_stays_within_twice_the_largest_step_seen():
    model = StepCostModel(min_samples=2)
    for rows in (1, 2, 3, 4):  # only tiny steps seen: a near-flat fit
        model.observe(rows, rows, 0.02)
    assert model.max_chunk(2, 2, 0, want=4096, seconds=10.0) == 2 * 4 - 2


def test_a_stalled_step_is_clipped_before_it_is_learned():
    model = fitted()
    before = model.predict(64, 50_000)
    model.observe(64, 50_000, 30.0)  # a 30 s pause (GC, a neighbour): at most 4x the prediction
    assert model.predict(64, 50_000) < 1.5 * before


def test_the_prior_before_the_fit_is_the_largest_steps_seconds_per_row():
    model = StepCostModel(min_samples=8)
    assert model.rough_per_row is None
    model.observe(1, 10, 0.020)  # a decode: its fixed part dominates
    assert model.rough_per_row == pytest.approx(0.020)
    model.observe(256, 16_000, 0.400)  # larger: replaces it
    model.observe(10, 100, 0.050)  # smaller: does not
    assert model.rough_per_row == pytest.approx(0.400 / 256)


def test_the_unrolled_solver_agrees_with_numpy_and_refuses_singular_systems():
    rng = np.random.default_rng(0)
    for n in (1, 2, 3):
        for _ in range(200):
            m = rng.normal(size=(n, n)) * 10.0 ** rng.integers(-4, 5, size=(n, 1))
            b = rng.normal(size=n)
            got = _solve(m.tolist(), b.tolist())
            assert got == pytest.approx(np.linalg.solve(m, b), rel=1e-6, abs=1e-9)
    assert _solve([[0.0]], [1.0]) is None
    assert _solve([[1.0, 2.0], [2.0, 4.0]], [1.0, 1.0]) is None
    assert _solve([[1.0, 2.0, 3.0], [2.0, 4.0, 6.0], [0.0, 0.0, 1.0]], [1.0, 2.0, 3.0]) is None


def _least_loss(xx: list[list[float]], xy: list[float]) -> float:
    """The smallest theta' XX theta - 2 theta' Xy over theta >= 0, by numpy: every subset of
    free coefficients solved exactly (the fit's tiny ridge left out), the non-negative solutions' losses compared (and 0)."""
    a, b, best = np.array(xx), np.array(xy), 0.0
    for k in (1, 2, 3):
        for free in itertools.combinations(range(3), k):
            theta = np.zeros(3)
            try:
                theta[list(free)] = np.linalg.solve(a[np.ix_(free, free)], b[list(free)])
            except np.linalg.LinAlgError:  # singular: no solution on this set
                continue
            if theta.min() >= 0:
                best = min(best, float(theta @ a @ theta - 2 * theta @ b))
    return best


def test_the_refit_from_the_last_active_set_reaches_the_least_loss():
    """The fit tries the last fit's free set first (issue 38's host time): in a steady state of
    64-row decodes with bursts of prefill, every refit's loss is the least any non-negative
    theta reaches (numpy's exhaustive search), whether the set was kept or searched again."""
    rng = random.Random(3)
    model = StepCostModel(decay=0.97)
    for k in range(400):
        if rng.random() < 0.7:  # decodes: rows fixed, pairs growing, timings noisy
            rows, pairs = 64, 64 * (100 + k)
        else:
            rows = rng.randrange(1, 600)
            pairs = rng.randrange(rows, rows * 900)
        seconds = 0.005 + rng.uniform(-0.004, 0.004) + rng.choice([0.0, 1e-5]) * rows
        model.observe(rows, pairs, seconds)
        fixed, per_row, per_pair = model.coefficients
        theta = np.array([fixed, per_row / 1e-3, per_pair / 1e-6])  # the fit's scaled features
        assert theta.min() >= 0
        a, b = np.array(model._xx), np.array(model._xy)
        loss = float(theta @ a @ theta - 2 * theta @ b)
        assert loss == pytest.approx(_least_loss(model._xx, model._xy), rel=1e-9, abs=1e-15)
