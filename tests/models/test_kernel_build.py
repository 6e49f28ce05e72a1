"""Building the C++ kernels: a build killed mid-way never blocks the next, a wait on a live build
says who holds it, and a build runs in a child that dies with its parent.

models/cpu_kernels/build_lock.py and builder.py, on a one-source extension (tests/models/
slow_build.py) in the test's own folder, compiled by a wrapper that stays in its compile step
until killed: hermetic, and a build is caught mid-compile for sure.
"""

from __future__ import annotations

import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from models.cpu_kernels.build_lock import TORCH_LOCK_NAME, held_build_lock
from models.cpu_kernels.builder import compile_in_child, load_or_compile
from tests.models.slow_build import (
    compiling_pids,
    pids_in_session,
    slow_compiler,
    tiny_spec,
    wait_for,
)

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)

ROOT = Path(__file__).resolve().parents[2]


def test_a_wait_on_a_live_build_names_its_holder_until_it_lets_go(tmp_path) -> None:
    held, release, acquired = threading.Event(), threading.Event(), threading.Event()
    reports: list[str] = []

    def holder() -> None:
        with held_build_lock(tmp_path, lambda message: None):
            held.set()
            release.wait(30)

    def waiter() -> None:
        with held_build_lock(tmp_path, reports.append, report_every=0.05, poll=0.01):
            acquired.set()

    threads = [threading.Thread(target=holder), threading.Thread(target=waiter)]
    threads[0].start()
    assert held.wait(10)
    threads[1].start()
    wait_for(lambda: len(reports) >= 3, 10, "periodic reports")
    assert not acquired.is_set()
    assert f"PID {os.getpid()} (holding it for" in reports[0], reports[0]
    release.set()
    for thread in threads:
        thread.join(10)
    assert acquired.is_set()


def test_the_lock_of_a_killed_holder_is_free_at_once(tmp_path) -> None:
    code = (
        "import sys, time; from pathlib import Path\n"
        "from models.cpu_kernels.build_lock import held_build_lock\n"
        "with held_build_lock(Path(sys.argv[1]), print):\n"
        "    print('held', flush=True); time.sleep(600)\n"
    )
    holder = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)], cwd=ROOT, stdout=subprocess.PIPE, text=True
    )
    try:
        assert holder.stdout.readline().strip() == "held"
    finally:
        holder.kill()
        holder.wait()
    reports: list[str] = []
    started = time.monotonic()
    with held_build_lock(tmp_path, reports.append):
        assert time.monotonic() - started < 2 and reports == []


def test_a_stale_torch_lock_is_removed_once_ours_is_held(tmp_path) -> None:
    (tmp_path / TORCH_LOCK_NAME).touch()  # what torch leaves when its build is killed
    reports: list[str] = []
    with held_build_lock(tmp_path, reports.append):
        assert not (tmp_path / TORCH_LOCK_NAME).exists()
    assert len(reports) == 1 and "killed" in reports[0]


def test_a_build_killed_mid_compile_takes_its_compiler_along_and_the_next_build_runs(
    tmp_path, caplog
) -> None:
    spec = tiny_spec(tmp_path / "ext")
    compilers = tmp_path / "cc"
    code = (
        "import sys; from pathlib import Path\n"
        "from models.cpu_kernels.builder import compile_in_child\n"
        "from tests.models.slow_build import tiny_spec\n"
        "compile_in_child(tiny_spec(Path(sys.argv[1])))\n"
    )
    parent = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path / "ext")],
        cwd=ROOT,
        env={**os.environ, "CXX": str(slow_compiler(compilers))},
    )
    try:
        wait_for(lambda: compiling_pids(compilers) or parent.poll() is not None, 180, "a compile")
        assert parent.poll() is None, "the build ended before its compile step"
        session = os.getsid(compiling_pids(compilers)[0])
        assert session != os.getsid(parent.pid)  # the build runs in a session of its own
    finally:
        parent.send_signal(signal.SIGKILL)
        parent.wait()
    wait_for(lambda: not pids_in_session(session), 10, "the orphaned build to kill itself")

    caplog.set_level(logging.INFO, logger="models.cpu_kernels.builder")
    started = time.monotonic()
    compile_in_child(spec, report_every=0.5)  # the real compiler now (no CXX)
    assert load_or_compile(spec).add_one(41) == 42
    logged = caplog.text
    assert "waiting" not in logged, logged  # nothing of the killed build held it up
    assert "[1/2] add_one.cpp compiled" in logged and "[2/2] linked" in logged, logged
    assert re.search(r"building C\+\+ kernels: \d+ s elapsed", logged), logged  # periodic
    assert time.monotonic() - started < 120
