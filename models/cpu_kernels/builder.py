"""Compiles a C++ extension in a child process that dies with its caller, logging progress.

Why a child: a cold build is 1-2 minutes of g++. Run in-process by torch's `load`, it could not
be stopped by SIGTERM (the server had to wait for it to end) and it said nothing while it ran.
The child runs in a session of its own, so stopping it kills that session, ninja and the
compilers included; and it kills its session itself when its parent dies (SIGKILL, the OOM
killer), so no orphaned build keeps writing into the cache.

Contract:
- `BuildSpec`: what to build (extension name, build directory, sources, flags).
- `load_or_compile(spec)`: under the build lock (models/cpu_kernels/build_lock.py), imports the
  library when it is built (its name hashes everything it depends on), else builds it with
  torch's `load` in this process.
- `compile_in_child(spec, niceness)`: runs `load_or_compile` in a child
  (`python -c` calling `main` here); returns once the library is built, raises
  RuntimeError (with the child's last output lines) when the build failed or was stopped. It
  logs a line per compiled source with the elapsed time, the child's lock waits, and every
  `report_every` seconds how long the build has run.
- `start_child(spec, niceness, output)`: that child, started and not waited for (builds ahead
  of need: models/cpu_kernels/background_build.py).
- `stop_builds()`: kills every live child build (its whole session); registered with atexit, so
  a process that exits during start-up takes its build with it.

A child's niceness applies to its whole session: the kernel groups the processes of a session
(an autogroup, where enabled) and shares the CPU between groups before it looks at a process's
own niceness, so the child lowers its group's weight too, else its compilers would take half of
the CPU from the parent whatever their niceness.
"""

from __future__ import annotations

import argparse
import atexit
import collections
import contextlib
import importlib.util
import json
import logging
import os
import re
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

from models.cpu_kernels.build_lock import held_build_lock

log = logging.getLogger(__name__)

_PACKAGE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding `models/`
_CHILD_PREFIX = "tgserve: "  # the child's own lines (lock waits), logged as they come
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\] (.*)$")
_CHILD_MAIN = "import sys; from models.cpu_kernels.builder import main; sys.exit(main())"


@dataclass(frozen=True)
class BuildSpec:
    name: str  # the extension module's name (keyed by a hash of everything it depends on)
    build_dir: Path
    sources: tuple[str, ...]
    include_dirs: tuple[str, ...] = ()
    cflags: tuple[str, ...] = ()
    ldflags: tuple[str, ...] = ()

    @property
    def library(self) -> Path:
        return self.build_dir / f"{self.name}.so"

    def to_json(self) -> str:
        return json.dumps({k: str(v) if isinstance(v, Path) else v for k, v in vars(self).items()})

    @classmethod
    def from_json(cls, text: str) -> BuildSpec:
        fields = json.loads(text)
        fields["build_dir"] = Path(fields["build_dir"])
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


def load_or_compile(spec: BuildSpec, verbose: bool = False) -> ModuleType:
    with held_build_lock(spec.build_dir, log.info):
        if spec.library.exists():
            try:
                return _import_library(spec)
            except ImportError as exc:  # e.g. cut short by a kill mid-link: built again below
                log.warning("rebuilding %s, which does not load: %s", spec.library, exc)
                spec.library.unlink(missing_ok=True)
        from torch.utils.cpp_extension import load

        return load(
            name=spec.name,
            sources=list(spec.sources),
            extra_include_paths=list(spec.include_dirs),
            extra_cflags=list(spec.cflags),
            extra_ldflags=list(spec.ldflags),
            build_directory=str(spec.build_dir),
            verbose=verbose,
        )


def _import_library(spec: BuildSpec) -> ModuleType:
    """Imports a built library as it is. Not torch's `load`, whose ninja run compares command
    lines that name this venv's torch headers: another venv would rebuild the shared build."""
    found = importlib.util.spec_from_file_location(spec.name, spec.library)
    if found is None or found.loader is None:
        raise ImportError(f"cannot import {spec.library}")
    module = importlib.util.module_from_spec(found)
    found.loader.exec_module(module)
    return module


_live: set[subprocess.Popen] = set()
_live_guard = threading.Lock()


def _kill_session(session: int) -> None:
    """SIGKILLs every process of a session, the caller last if it is a member. A session, not a
    process group: ninja starts each compile in a process group of its own, but it stays in
    ninja's session."""
    me = os.getpid()
    for _ in range(3):  # ninja may start a compile between a pass's listing and its kills
        members = []
        for entry in Path("/proc").iterdir():
            with contextlib.suppress(ValueError, OSError):
                if int(entry.name) != me and os.getsid(int(entry.name)) == session:
                    members.append(int(entry.name))
        for pid in members:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if not members:
            break
    if os.getsid(0) == session:
        os.kill(me, signal.SIGKILL)


def forget(child: subprocess.Popen) -> None:
    """A child of `start_child` that has ended leaves the live builds."""
    with _live_guard:
        _live.discard(child)


def stop_builds() -> None:
    with _live_guard:
        children = list(_live)
    for child in children:
        _kill_session(child.pid)  # the child leads a session of its own


atexit.register(stop_builds)


class _Progress:
    """Reads the child's output: ninja's step lines, the child's own lines, a tail for errors."""

    def __init__(self, started: float) -> None:
        self.started = started
        self.done, self.total = 0, 0
        self.tail: collections.deque[str] = collections.deque(maxlen=25)

    def read(self, stream) -> None:
        for raw in stream:
            line = raw.rstrip("\n")
            self.tail.append(line)
            if line.startswith(_CHILD_PREFIX):
                log.info("%s", line[len(_CHILD_PREFIX) :])
            elif step := _NINJA_STEP.match(line):
                self.done, self.total = int(step[1]), int(step[2])
                log.info(
                    "building C++ kernels: [%d/%d] %s (%.0f s)",
                    self.done,
                    self.total,
                    _what_finished(step[3]),
                    time.monotonic() - self.started,
                )


def _what_finished(command: str) -> str:
    """ninja prints a step's command when it ends: name its source, or the link."""
    source = re.search(r" -c (\S+)", command)
    if source:
        return f"{Path(source[1]).name} compiled"
    return "linked" if " -shared " in f" {command} " or ".so" in command else command[:60]


def start_child(spec: BuildSpec, niceness: int, output: int, **env: str) -> subprocess.Popen:
    """The build child of `compile_in_child`, not waited for: its output to `output` (a
    subprocess target), `env` added to this process's environment."""
    env = {**os.environ, **env}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(_PACKAGE_ROOT), env.get("PYTHONPATH")) if p)
    command = [sys.executable, "-u", "-c", _CHILD_MAIN, "--spec", spec.to_json()]
    command += ["--parent", str(os.getpid()), "--nice", str(niceness)]
    with _live_guard:  # no stop_builds() between the start and the registration
        child = subprocess.Popen(
            command,
            stdout=output,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            start_new_session=True,
            env=env,
        )
        _live.add(child)
    return child


def compile_in_child(spec: BuildSpec, niceness: int = 0, report_every: float = 15.0) -> None:
    started = time.monotonic()
    log.info(
        "building C++ kernels %s in a child process (cold: 1-2 minutes; cached after)", spec.name
    )
    child = start_child(spec, niceness, subprocess.PIPE)
    progress = _Progress(started)
    reader = threading.Thread(target=progress.read, args=(child.stdout,), daemon=True)
    reader.start()
    try:
        while True:
            try:
                code = child.wait(timeout=report_every)
                break
            except subprocess.TimeoutExpired:
                log.info(
                    "building C++ kernels: %.0f s elapsed, %d of %s steps done",
                    time.monotonic() - started,
                    progress.done,
                    progress.total or "?",
                )
    finally:
        with _live_guard:
            _live.discard(child)
    reader.join(timeout=5)
    if code != 0:
        how = f"was killed by signal {-code}" if code < 0 else f"exited with {code}"
        tail = "\n".join(progress.tail)
        raise RuntimeError(f"the C++ kernel build {how}; its last lines:\n{tail}")
    log.info("built C++ kernels %s in %.0f s", spec.name, time.monotonic() - started)


def _die_with_parent(parent: int) -> None:
    """Kills this session (ninja and the compilers too, this process last) once the parent
    is gone."""

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.2)
        _kill_session(os.getsid(0))

    threading.Thread(target=watch, daemon=True).start()


def _lower_priority(niceness: int) -> None:
    """This process's niceness, and its session's group's (the module docstring says why)."""
    os.nice(niceness)
    with contextlib.suppress(OSError):  # no autogroups here (kernel option, read-only /proc)
        Path("/proc/self/autogroup").write_text(str(min(niceness, 19)))


def main(argv: list[str] | None = None) -> int:
    """The child (`_CHILD_MAIN`): `--spec JSON --parent PID [--nice N]`."""
    parser = argparse.ArgumentParser(prog="tgserve-kernel-build")
    parser.add_argument("--spec", required=True)
    parser.add_argument("--parent", type=int, required=True)
    parser.add_argument("--nice", type=int, default=0)
    args = parser.parse_args(argv)
    _die_with_parent(args.parent)
    if args.nice:
        _lower_priority(args.nice)  # serving on the PyTorch path meanwhile comes first
    handler = logging.StreamHandler(sys.stdout)
    handler.setFormatter(logging.Formatter(_CHILD_PREFIX + "%(message)s"))
    log.addHandler(handler)
    log.setLevel(logging.INFO)
    load_or_compile(BuildSpec.from_json(args.spec), verbose=True)
    return 0
