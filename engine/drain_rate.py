"""DrainRate: how fast in-flight requests finish, and so when a refused client should retry.

Contract: `released(now)` is called once per request that leaves the in-flight set (finished,
aborted, failed); `refused(now)` once per request turned away, and returns the seconds it
should wait (the 429's Retry-After): the k-th refusal since the last release is told
k / rate, so a burst of refused clients comes back spread over the time the in-flight work
needs to make room for them, not all at once. The rate is releases per second over the last
`window` releases no older than `horizon` seconds, counted up to now (a stalled server's rate
falls). Without a measured rate, `default` seconds. Answers are clamped to [minimum, maximum].
Pure Python; the caller passes the clock's value and holds its own lock.
"""

from __future__ import annotations

from collections import deque


class DrainRate:
    def __init__(
        self,
        default: float = 1.0,
        minimum: float = 1.0,
        maximum: float = 60.0,
        window: int = 64,
        horizon: float = 60.0,
    ) -> None:
        self.default, self.minimum, self.maximum = default, minimum, maximum
        self.horizon = horizon
        self._times: deque[float] = deque(maxlen=window)
        self._refused_since_release = 0

    def released(self, now: float, count: int = 1) -> None:
        for _ in range(count):
            self._times.append(now)
        if count:
            self._refused_since_release = 0

    def rate(self, now: float) -> float | None:
        """Releases per second, or None before there are two recent ones."""
        while self._times and now - self._times[0] > self.horizon:
            self._times.popleft()
        if len(self._times) < 2:
            return None
        return len(self._times) / max(now - self._times[0], 1e-3)

    def refused(self, now: float) -> float:
        self._refused_since_release += 1
        rate = self.rate(now)
        wait = self.default if rate is None else self._refused_since_release / rate
        return min(self.maximum, max(self.minimum, wait))
