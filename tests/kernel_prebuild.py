"""Starts the C++ kernel builds a broad test run will need, in the background, as it begins.

A cold build of the kernels takes minutes of both cores, and the tests that need the builds for
other instruction sets (tests/models: -march=haswell, x86-64-v2, ...) come late in a run; the
tests before them leave CPU idle (servers started and waited for, sockets, sleeps, one thread of
Python). So a run that collects at least BROAD_RUN tests (the suite, as CI runs it) starts, one
after the other, at niceness 19 for their whole session (models/cpu_kernels/background_build.py),
the native build (at the session's start already when pytest runs its testpaths), then every
build a collected test module names in its KERNEL_BUILDS ((march, kernel set) pairs,
models/cpu_kernels KERNEL_SETS), in the order the modules come. A test that needs a build
before it is done raises it to its own priority and waits on its build lock, or builds it
itself if the background build failed. Nothing else changes: the same build specs (sources, flags, names), the same cache.
TGSERVE_TEST_PREBUILD=0 turns this off, =1 on for a run of any size; a run on another device
than the CPU never prebuilds.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Iterable
from types import ModuleType

log = logging.getLogger(__name__)

ENV = "TGSERVE_TEST_PREBUILD"
BROAD_RUN = 1000  # the suite is ~2,400 tests; a file or a folder of them stays below
NICENESS = 19  # a test that waits for its build raises it to its own (cpu_kernels.build)


def wanted_builds(modules: Iterable[ModuleType | None]) -> list[tuple[str, str]]:
    """The native build first (most tests load it), then the modules' KERNEL_BUILDS in order."""
    builds = [("native", "all")]
    for module in modules:
        for build in getattr(module, "KERNEL_BUILDS", ()):
            if build not in builds:
                builds.append(build)
    return builds


def should_prebuild(test_count: int) -> bool:
    setting = os.environ.get(ENV, "")
    if setting == "0" or os.environ.get("TGSERVE_TEST_DEVICE", "cpu") != "cpu":
        return False
    return setting == "1" or test_count >= BROAD_RUN


_started: set[tuple[str, str]] = set()  # the builds this process has started


def start(modules: Iterable[ModuleType | None], test_count: int) -> threading.Thread | None:
    """Starts the builds not started yet (a daemon thread runs them one by one) when the run
    asks for them."""
    if not should_prebuild(test_count):
        return None
    builds = [build for build in wanted_builds(modules) if build not in _started]
    _started.update(builds)
    thread = threading.Thread(target=_build_in_turn, args=(builds,), daemon=True)
    thread.start()
    return thread


def start_native_if_whole_suite(config) -> None:
    """At the session's start, before the collection (whose imports take a while, and some of
    which load the native build): the native build, when pytest runs its testpaths (no paths
    given, as CI does) or TGSERVE_TEST_PREBUILD=1."""
    whole = config.args_source == config.ArgsSource.TESTPATHS
    start([], BROAD_RUN if whole else 0)


def _build_in_turn(builds: list[tuple[str, str]]) -> None:
    from models import cpu_kernels
    from models.cpu_kernels.background_build import start_in_background

    for march, kernels in builds:
        try:
            spec = cpu_kernels.build_spec(march, kernels)
            cpu_kernels.stage_sources(spec)
            if not spec.library.exists():
                start_in_background(spec, NICENESS).wait()
        except Exception as exc:  # the test that needs it builds it, and says why it failed
            log.warning("the background build of %s %s failed: %s", march, kernels, exc)
