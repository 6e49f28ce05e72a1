"""Kernel builds started ahead of need, at a low priority, and raised when someone waits.

Contract:
- `start_in_background(spec, niceness, jobs)`: starts the build child of `spec`
  (models/cpu_kernels/builder.py: a session of its own that dies with this process; the output
  dropped) at `niceness`, for its whole session (builder.py says why), with at most `jobs`
  compilers at once; returns it without waiting. tests/kernel_prebuild.py starts the test
  suite's builds this way.
- `raise_priority(spec, niceness)`: a live background build of `spec` runs at the priority of
  `builder.compile_in_child(spec, niceness)` from now on, where this process may raise
  priorities (root, CAP_SYS_NICE; else it stays niced).
  `cpu_kernels.build` calls it before it waits for the build lock: the caller needs the
  library now, so its build stops yielding to the rest of the machine.
Either way the build is the same: the same spec (sources, flags, name), the same lock and cache.
"""

from __future__ import annotations

import contextlib
import logging
import os
import subprocess
import threading
from pathlib import Path

from models.cpu_kernels.builder import BuildSpec, forget, start_child

log = logging.getLogger(__name__)

_started: dict[str, subprocess.Popen] = {}  # the last background build of each library name


def start_in_background(spec: BuildSpec, niceness: int = 19, jobs: int = 2) -> subprocess.Popen:
    log.info("building C++ kernels %s in the background", spec.name)
    child = start_child(spec, niceness, subprocess.DEVNULL, MAX_JOBS=str(jobs))
    _started[spec.name] = child

    def reap() -> None:
        child.wait()
        forget(child)

    threading.Thread(target=reap, daemon=True).start()
    return child


def raise_priority(spec: BuildSpec, niceness: int) -> None:
    """The priority `compile_in_child(spec, niceness)` gives its child: this process's niceness
    plus `niceness` for each process, `niceness` for the group."""
    child = _started.get(spec.name)
    if child is None or child.poll() is not None:
        return
    with contextlib.suppress(OSError):  # the group's weight (autogroups), then each process's
        Path(f"/proc/{child.pid}/autogroup").write_text(str(min(max(niceness, 0), 19)))
    own = min(os.getpriority(os.PRIO_PROCESS, 0) + niceness, 19)
    for entry in Path("/proc").iterdir():
        with contextlib.suppress(ValueError, OSError):
            if os.getsid(int(entry.name)) == child.pid:
                os.setpriority(os.PRIO_PROCESS, int(entry.name), own)
