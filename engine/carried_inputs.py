"""CarriedTokens: the previous step's drawn tokens, kept below the runner boundary for the
inputs of the next step that carries them (issue 38, the overlapped loop's second part).

The overlapped loop (engine/step_pipeline.py) schedules step k+1 before step k's tokens reach
the host: the scheduler sees a placeholder where a sequence's newest token will be, and the
step's `StepSampling.carried` pairs (chunk index, draw index of step k) say which chunk's last
input is which of step k's draws. A runner keeps each step's output (`keep`; `drop` when a
step fails, so a step carrying its tokens fails too instead of reading stale ones) and
`resolve(chunks, carried)` returns the chunks with `carried_input` set on the carried ones
(a steady step's columns, engine/scheduling/decode_columns.py: their `with_carried`).
Steps run in order on a runner, so the kept output is always step k's when step k+1 runs.
On the CPU that output is host data already; a device whose steps run on their own would keep
the sampled ids on the device and gather them into the next step's input ids there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from engine.sampling.step_io import StepOutput


class CarriedTokens:
    def __init__(self) -> None:
        self._last: tuple[int, ...] | None = None  # the previous step's token per draw
        self.num_carried = 0  # inputs resolved so far (tests, benches)

    def keep(self, output: StepOutput) -> None:
        self._last = output.tokens

    def drop(self) -> None:
        self._last = None

    def resolve(self, chunks: Sequence[Any], carried: Sequence[tuple[int, int]]) -> Sequence[Any]:
        if not carried:
            return chunks
        last = self._last
        if last is None:
            raise RuntimeError("a step carries the previous step's tokens, which failed")
        self.num_carried += len(carried)
        with_carried = getattr(chunks, "with_carried", None)  # a steady step's columns
        if with_carried is not None:
            return with_carried({index: last[draw] for index, draw in carried})
        resolved = list(chunks)
        for index, draw in carried:
            resolved[index] = dataclasses.replace(resolved[index], carried_input=last[draw])
        return resolved
