"""Builds the container test's image in the background, on idle CPU, from the collection on.

The image build (the C++ kernels compiled inside it: minutes of both cores on a cold cache) used
to run at the setup of the first test that needs it; nothing else ran meanwhile. Now:
- `start(items)`: when the collected `items` include tests that use the `image` fixture of
  tests/deploy/test_container.py, Docker is made ready here (at normal priority, so its apt
  install cannot race the tests that call `ensure_tools()`), then a daemon thread builds the
  image exactly as the fixture built it (`build()`: the same Dockerfile, base, build arguments and
  tag) with every build step in a cgroup marked `cpu.idle` (SCHED_IDLE: it runs only on CPU time
  no test wants; the base's mmdebstrap too). The thread itself stays at normal priority: it holds
  the GIL now and then, and a starved GIL holder would stall the tests.
  `order_last(items)` moves those tests to the end of the run, so the build overlaps the rest.
- `wait()`: called by the `image` fixture; lifts the cgroup to normal priority (the test needs
  the image now), waits for the thread and returns the build's seconds. Without a background
  build (none started, or it failed) it builds in the foreground: a failure is reported by the
  test, and the layers a failed background build finished are reused from Docker's cache.
- `stop()`: at the session's end a build still running is cancelled (its docker client killed).
Nothing is skipped or changed in what the test proves: the built image is the one the fixture
built before. No background build where the cpu cgroup cannot be made (no root, cgroup v2 only),
where Docker cannot be made ready (the fixture then fails its tests, saying why; the rest of the
run goes on), under xdist workers, for --collect-only, or with TGSERVE_TEST_PREBUILD=0.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterable
from contextlib import nullcontext
from pathlib import Path

import pytest

from tests.deploy import docker_host

IMAGE = "tgserve:container-test"
TEST_MODULE = "tests.deploy.test_container"
CGROUP = Path("/sys/fs/cgroup/cpu/tgserve-test-image-build")  # cgroup v1's cpu hierarchy
USAGE = Path("/sys/fs/cgroup/cpuacct") / CGROUP.name / "cpuacct.usage"  # ns, children included

_build: dict[str, object] = {}  # "thread", and "seconds" or "error" once it ends, CPU seconds


def _cpu_seconds() -> float:
    """The CPU time every process of the cgroup ever took (docker makes the cpuacct twin)."""
    try:
        return int(USAGE.read_text()) / 1e9
    except (OSError, ValueError):
        return 0.0


def build(cgroup: Path | None = None) -> float:
    """Builds IMAGE as users build it (torch from the local wheel, served as an index, where pip
    has one; else PyTorch's CPU index); with `cgroup`, every build step runs inside it."""
    docker_host.ensure_docker()
    wheels = docker_host.find_links()
    with docker_host.wheel_index(wheels) if wheels else nullcontext() as url:
        args = ["--build-arg", f"TORCH_INDEX_URL={url}"] if url else []
        if cgroup is not None:
            args += ["--cgroup-parent", f"/{cgroup.name}"]
        return docker_host.build_image(IMAGE, *args, cgroup=cgroup)


def needs_image(item: pytest.Item) -> bool:
    module = getattr(item, "module", None)
    return getattr(module, "__name__", "") == TEST_MODULE and "image" in item.fixturenames


def order_last(items: list[pytest.Item]) -> None:
    """Moves the tests that need the image to the end, in their order (in place)."""
    if any(needs_image(item) for item in items):
        items[:] = [i for i in items if not needs_image(i)] + [i for i in items if needs_image(i)]


def _idle_cgroup() -> Path | None:
    with contextlib.suppress(OSError):
        CGROUP.mkdir(exist_ok=True)
        (CGROUP / "cpu.idle").write_text("1")
        return CGROUP
    return None


def start(items: Iterable[pytest.Item], config: pytest.Config) -> bool:
    """Starts the background build when the run needs the image (see the module's docstring)."""
    if (
        started()
        or os.environ.get("TGSERVE_TEST_PREBUILD") == "0"
        or os.environ.get("PYTEST_XDIST_WORKER")
        or config.option.collectonly
        or not any(needs_image(item) for item in items)
    ):
        return False
    cgroup = _idle_cgroup()
    if cgroup is None:
        return False
    try:
        docker_host.ensure_docker()
    except (Exception, pytest.fail.Exception):  # no Docker: the fixture fails its tests, saying why
        return False
    _build["cpu_before"] = _cpu_seconds()

    def run() -> None:
        try:
            _build["seconds"] = build(cgroup)
        except BaseException as exc:  # pytest.fail raises an OutcomeException
            _build["error"] = exc

    _build["thread"] = thread = threading.Thread(target=run, name="image-prebuild", daemon=True)
    thread.start()
    return True


def started() -> bool:
    return "thread" in _build


def idle_cpu_seconds() -> float:
    """The CPU seconds the background build took on idle time, before a test needed it."""
    return float(_build.get("idle_cpu", 0.0))  # type: ignore[arg-type]


def wait() -> float:
    """The seconds the image took to build, in the background or (failing that) now."""
    thread = _build.get("thread")
    if isinstance(thread, threading.Thread):
        _build["idle_cpu"] = _cpu_seconds() - float(_build["cpu_before"])  # type: ignore[arg-type]
        with contextlib.suppress(OSError):
            (CGROUP / "cpu.idle").write_text("0")  # needed now: no longer on idle time only
        thread.join()
        if "seconds" in _build:
            return float(_build["seconds"])  # type: ignore[arg-type]
    return build()


def stop() -> None:
    """Cancels a build still running (its docker client killed: Docker stops the build)."""
    docker_host.stop_builds()
