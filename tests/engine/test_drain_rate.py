"""DrainRate: Retry-After from the observed drain rate, spread over a burst of refusals."""

from __future__ import annotations

import pytest

from engine.drain_rate import DrainRate


def test_without_a_measured_rate_the_default_is_given():
    drain = DrainRate(default=2.0)
    assert drain.refused(0.0) == 2.0
    drain.released(1.0)
    assert drain.refused(1.5) == 2.0  # one release is no rate yet


def test_the_kth_refusal_since_a_release_waits_k_over_the_rate():
    drain = DrainRate(minimum=0.0, maximum=1000.0)
    for t in range(10):  # one request finishes every 0.5 s: 2 per second
        drain.released(t * 0.5)
    now = 4.5
    rate = 10 / 4.5  # ten releases over the 4.5 s since the first, counted up to now
    assert drain.rate(now) == pytest.approx(rate)
    assert [drain.refused(now) for _ in range(3)] == pytest.approx([1 / rate, 2 / rate, 3 / rate])
    drain.released(now)  # room was made: the count starts again
    assert drain.refused(now) == pytest.approx(1 / drain.rate(now))


def test_a_stalled_server_drains_slower_and_old_releases_are_forgotten():
    drain = DrainRate(minimum=0.0, maximum=1000.0, horizon=60.0)
    for t in range(10):
        drain.released(float(t))
    assert drain.rate(10.0) > drain.rate(30.0)  # nothing finished since: the rate falls
    assert drain.rate(100.0) is None  # all older than the horizon


def test_answers_are_clamped():
    drain = DrainRate(minimum=1.0, maximum=5.0)
    for t in range(100):
        drain.released(t * 0.1)  # 10 per second
    assert drain.refused(10.0) == 1.0  # 0.1 s
    for _ in range(100):
        drain.refused(10.0)
    assert drain.refused(10.0) == 5.0  # 10.2 s
