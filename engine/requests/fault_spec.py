"""FaultSpec: fault injection for tests, a request that fails itself, or kills the engine loop,
on cue.

Contract:
- `FaultSpec` is frozen and names exactly one fault, counted in generated tokens (the most any
  sequence of the request has generated):
  - `fail_after_tokens=k`: once the request has generated k tokens (k >= 1) and has not
    finished otherwise, the engine finishes it with finish_reason "error" and
    `FAULT_ERROR_MESSAGE`; the other requests of the batch go on untouched;
  - `kill_engine_after_tokens=k`: once the request has generated k tokens, `step()` raises
    `FatalEngineError`, which `AsyncEngine` treats as fatal at once: every in-flight request
    ends with "error" and the loop stops (so /health fails and the server exits non-zero).
- It rides on `SamplingParams.fault`. Engines honour it (`apply_faults` in engine/faults.py
  for `Engine`, the tests' FakeEngine on its own); only the server decides who may set it: the
  HTTP `fault` field is refused with a 400 unless `--enable-fault-injection` is on. Never for
  production.
"""

from __future__ import annotations

from dataclasses import dataclass

from engine.errors import FatalEngineError

FAULT_ERROR_MESSAGE = "injected fault: the request failed after {k} generated token(s)"


@dataclass(frozen=True)
class FaultSpec:
    fail_after_tokens: int | None = None
    kill_engine_after_tokens: int | None = None

    def __post_init__(self) -> None:
        given = [
            k for k in (self.fail_after_tokens, self.kill_engine_after_tokens) if k is not None
        ]
        if len(given) != 1:
            raise ValueError(
                "fault must name exactly one of fail_after_tokens or kill_engine_after_tokens"
            )
        if isinstance(given[0], bool) or not isinstance(given[0], int) or given[0] < 1:
            raise ValueError(f"fault token counts must be integers >= 1, got {given[0]!r}")

    def due(self, generated: int) -> str | None:
        """Which fault fires once `generated` tokens exist: "fail", "kill" or None."""
        if self.fail_after_tokens is not None and generated >= self.fail_after_tokens:
            return "fail"
        if self.kill_engine_after_tokens is not None and generated >= self.kill_engine_after_tokens:
            return "kill"
        return None

    def error_message(self) -> str:
        return FAULT_ERROR_MESSAGE.format(k=self.fail_after_tokens)

    def kill_error(self, request_id: str) -> FatalEngineError:
        return FatalEngineError(
            f"injected fault: request {request_id} killed the engine after "
            f"{self.kill_engine_after_tokens} generated token(s)"
        )
