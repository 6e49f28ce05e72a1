"""Runs the GPU check's stages one after another inside one time budget, recording each.

Contract (standard library only): `run_stages(stages, budget_s, env, log)` runs every stage as a
subprocess in its own process group (a timeout kills the whole group: pytest workers, a server)
with a limit of min(stage cap, what is left of the budget); a stage is skipped, and says so, when
less than its `min_s` is left. A stage that fails, times out or cannot start is recorded, and the
next one runs. Each stage's output goes to `log` under a header (the report keeps only tails);
`StageResult.stdout` keeps the whole standard output for the findings. The install stage's
target folder is put on PYTHONPATH for the stages after it.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TextIO

from bench.gpu_check.plan import Stage

TAIL_LINES = 25


@dataclass
class StageResult:
    name: str
    title: str
    command: str
    status: str  # "ok" | "failed" | "timeout" | "skipped"
    rc: int | None
    seconds: float
    limit_s: float
    stdout: str
    tail: str  # the last lines of stdout and stderr, for the report
    reason: str = ""  # why it was skipped or could not start


def run_stages(
    stages: Sequence[Stage], budget_s: float, env: dict[str, str], log: TextIO
) -> list[StageResult]:
    deadline = time.monotonic() + budget_s
    results = []
    for stage in stages:
        left = deadline - time.monotonic()
        limit = min(stage.cap_s, left)
        needs = min(stage.min_s, stage.cap_s)
        if limit < needs:
            why = f"{left:.0f} s of the budget left, the stage needs {needs:.0f}"
            results.append(_skipped(stage, why))
        else:
            results.append(run_stage(stage, limit, env, log))
    return results


def run_stage(stage: Stage, limit_s: float, env: dict[str, str], log: TextIO) -> StageResult:
    command = " ".join(stage.argv)
    log.write(f"\n===== {stage.name}: {command} (limit {limit_s:.0f} s)\n")
    log.flush()
    start = time.monotonic()
    try:
        proc = subprocess.Popen(
            stage.argv,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, **stage.env},
            start_new_session=True,  # its own group: a timeout ends its children too
        )
    except OSError as exc:
        return _skipped(stage, f"could not start: {exc}")
    timed_out = False
    try:
        out, err = proc.communicate(timeout=limit_s)
    except subprocess.TimeoutExpired:
        timed_out = True
        _kill_group(proc)
        out, err = proc.communicate()
    seconds = time.monotonic() - start
    log.write(out + ("\n----- stderr\n" + err if err else ""))
    log.write(f"\n----- {stage.name}: rc {proc.returncode}, {seconds:.1f} s\n")
    log.flush()
    status = "timeout" if timed_out else ("ok" if proc.returncode == 0 else "failed")
    tail = "\n".join((out.rstrip() + "\n" + err.rstrip()).strip().splitlines()[-TAIL_LINES:])
    return StageResult(
        stage.name, stage.title, command, status, proc.returncode, seconds, limit_s, out, tail
    )


def _kill_group(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # the group this runner made for the stage


def _skipped(stage: Stage, reason: str) -> StageResult:
    return StageResult(
        stage.name, stage.title, " ".join(stage.argv), "skipped", None, 0.0, 0.0, "", "", reason
    )


def with_site(env: dict[str, str], site: str) -> dict[str, str]:
    """`env` with `site` (the installed wheels) and the working tree first on PYTHONPATH."""
    parts = [site, os.getcwd()] + [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    return {**env, "PYTHONPATH": os.pathsep.join(parts)}
