"""A fake step-cost model and a fake clock for the step-time scheduling tests
(test_step_time_scheduling.py, test_step_time_fairness.py): a step costs exactly what
`FakeCost.predict` says, and `Clock` advances by it."""

from __future__ import annotations

from tests.engine.scheduling.scheduler_driver import Driver


class FakeCost:
    """seconds = fixed + per_row * rows + per_pair * pairs, known exactly; always ready.
    `max_chunk` searches chunk sizes one by one: an oracle independent of the real model's."""

    ready = True

    def __init__(self, fixed: float, per_row: float, per_pair: float = 0.0) -> None:
        self.coefficients = (fixed, per_row, per_pair)

    def predict(self, rows: int, pairs: int) -> float:
        fixed, per_row, per_pair = self.coefficients
        return fixed + per_row * rows + per_pair * pairs

    def observe(self, rows: int, pairs: int, seconds: float) -> None:
        pass

    def max_chunk(self, rows: int, pairs: int, start: int, want: int, seconds: float) -> int:
        n = 0
        while n < want:
            k = n + 1
            if self.predict(rows + k, pairs + k * start + k * (k + 1) // 2) > seconds + 1e-9:
                break
            n = k
        return n


class Clock:
    """Fake time: each step lasts what the fake cost model says it does."""

    def __init__(self, cost: FakeCost) -> None:
        self.cost, self.now = cost, 0.0

    def step(self, driver: Driver):
        out = driver.step()
        if out.chunks:
            self.now += self.cost.predict(out.num_batched_tokens, out.num_pairs)
        return out, self.now


def chunk_of(out, rid: str) -> int:
    return sum(c.num_new_tokens for c in out.chunks if c.request.request_id == rid)
