"""A lock around one kernel build directory that cannot outlive its holder.

Why: torch.utils.cpp_extension guards a build directory with a `lock` file it creates and
deletes itself; a build killed mid-way (SIGKILL, the OOM killer, a `timeout`) leaves the file
behind, and every later load of that extension waits on it forever (issue 26). An `fcntl.flock`
is released by the kernel when the holder's file is closed, however its process ended.

Contract: `held_build_lock(build_dir, say)` is a context manager that takes an exclusive flock on
`<build_dir>/tgserve-build.lock` (created, never deleted: deleting a lock file races with
its next taker), stamps it with the holder's PID and start time, and, once held, removes a
torch `lock` file found in the directory: every build or load of our extensions takes this
lock first, so a torch lock seen by its holder was left by a dead process. While another live
process holds it, `say(message)` is called at once and then every `report_every` seconds
with that process's PID and how long it has held the lock. The wait polls (it never blocks in
the kernel), so signals and interpreter shutdown are never held up by it.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import time
from collections.abc import Callable, Iterator
from pathlib import Path

LOCK_NAME = "tgserve-build.lock"
TORCH_LOCK_NAME = "lock"  # torch.utils.cpp_extension's FileBaton in the build directory


def _holder(lock_file: Path) -> tuple[int, float] | None:
    """(PID, time it took the lock) as the holder stamped them, or None when unreadable."""
    try:
        pid, since = lock_file.read_text().split()
        return int(pid), float(since)
    except (OSError, ValueError):
        return None


def _describe_holder(lock_file: Path) -> str:
    holder = _holder(lock_file)
    if holder is None:
        return "another process"
    pid, since = holder
    return f"PID {pid} (holding it for {time.time() - since:.0f} s)"


@contextlib.contextmanager
def held_build_lock(
    build_dir: Path,
    say: Callable[[str], None],
    report_every: float = 10.0,
    poll: float = 0.2,
) -> Iterator[None]:
    build_dir.mkdir(parents=True, exist_ok=True)
    lock_file = build_dir / LOCK_NAME
    fd = os.open(lock_file, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        _acquire(fd, lock_file, say, report_every, poll)
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()} {time.time():.3f}\n".encode(), 0)
        stale = build_dir / TORCH_LOCK_NAME
        if stale.exists():
            say(f"removing {stale}, left by a build that was killed before it finished")
            stale.unlink(missing_ok=True)
        yield
    finally:
        os.close(fd)  # releases the flock


def _acquire(
    fd: int, lock_file: Path, say: Callable[[str], None], report_every: float, poll: float
) -> None:
    started = time.monotonic()
    next_report = started
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        now = time.monotonic()
        if now >= next_report:
            say(
                f"waiting for the C++ kernel build of {_describe_holder(lock_file)} in "
                f"{lock_file.parent} ({now - started:.0f} s so far)"
            )
            next_report = now + report_every
        time.sleep(poll)
