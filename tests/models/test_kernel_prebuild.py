"""The kernel builds a broad test run starts ahead of need (tests/kernel_prebuild.py), and the
background build child they run in (models/cpu_kernels/builder.py `start_in_background`): which
builds, in what order, when, and at what priority. Tiny one-source extensions
(tests/models/slow_build.py) stand in for the kernels.
"""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest

from models import cpu_kernels
from models.cpu_kernels import builder
from models.cpu_kernels.background_build import raise_priority, start_in_background
from models.cpu_kernels.builder import compile_in_child, load_or_compile
from tests import kernel_prebuild
from tests.models.slow_build import alive, compiling_pids, slow_compiler, tiny_spec, wait_for


def test_the_native_build_comes_first_then_each_modules_builds_once_in_order() -> None:
    modules = [
        SimpleNamespace(KERNEL_BUILDS=[("haswell", "all")]),
        None,  # a test item without a module (a doctest, a YAML case)
        SimpleNamespace(),
        SimpleNamespace(KERNEL_BUILDS=[("haswell", "all"), ("x86-64-v2", "linear")]),
        SimpleNamespace(KERNEL_BUILDS=[("native", "all"), ("x86-64-v2", "linear")]),
    ]
    assert kernel_prebuild.wanted_builds(modules) == [
        ("native", "all"),
        ("haswell", "all"),
        ("x86-64-v2", "linear"),
    ]


@pytest.mark.parametrize(
    "setting,device,count,expected",
    [
        ("", "cpu", kernel_prebuild.BROAD_RUN, True),
        ("", "cpu", kernel_prebuild.BROAD_RUN - 1, False),
        ("1", "cpu", 1, True),
        ("0", "cpu", 10 * kernel_prebuild.BROAD_RUN, False),
        ("1", "cuda", 10 * kernel_prebuild.BROAD_RUN, False),
    ],
)
def test_only_a_broad_cpu_run_or_the_setting_prebuilds(
    monkeypatch, setting, device, count, expected
) -> None:
    monkeypatch.setenv(kernel_prebuild.ENV, setting)
    monkeypatch.setenv("TGSERVE_TEST_DEVICE", device)
    assert kernel_prebuild.should_prebuild(count) is expected


@pytest.mark.parametrize("source,count", [("TESTPATHS", kernel_prebuild.BROAD_RUN), ("ARGS", 0)])
def test_the_session_starts_the_native_build_when_pytest_runs_its_testpaths(
    monkeypatch, source, count
) -> None:
    calls = []
    monkeypatch.setattr(kernel_prebuild, "start", lambda modules, n: calls.append((modules, n)))
    config = SimpleNamespace(ArgsSource=pytest.Config.ArgsSource)
    config.args_source = getattr(pytest.Config.ArgsSource, source)
    kernel_prebuild.start_native_if_whole_suite(config)
    assert calls == [([], count)]


def test_the_builds_run_one_after_another_into_their_specs(tmp_path, monkeypatch) -> None:
    """The order and the specs (a real background build: the test below)."""
    started: list[tuple[str, int]] = []

    def spec(march: str, kernels: str):
        return tiny_spec(tmp_path / f"{march}-{kernels}")

    def build(spec, niceness: int):
        assert started == [] or Path(started[-1][0]).exists()  # the previous one has ended
        started.append((str(spec.library), niceness))
        spec.library.parent.mkdir(parents=True, exist_ok=True)
        return SimpleNamespace(wait=lambda: spec.library.write_bytes(b"built"))

    monkeypatch.setattr(cpu_kernels, "build_spec", spec)
    monkeypatch.setattr(cpu_kernels, "stage_sources", lambda spec: None)
    monkeypatch.setattr("models.cpu_kernels.background_build.start_in_background", build)
    monkeypatch.setattr(kernel_prebuild, "_started", set())
    monkeypatch.setenv(kernel_prebuild.ENV, "1")
    spec("haswell", "all").library.parent.mkdir(parents=True)
    spec("haswell", "all").library.write_bytes(b"built before")  # found built: not started
    module = SimpleNamespace(KERNEL_BUILDS=[("haswell", "all"), ("x86-64-v2", "linear")])
    kernel_prebuild.start([module, module], 2).join(timeout=60)
    assert started == [
        (str(spec("native", "all").library), 19),
        (str(spec("x86-64-v2", "linear").library), 19),
    ]
    later = SimpleNamespace(KERNEL_BUILDS=[("x86-64-v2", "linear"), ("icelake-server", "linear")])
    kernel_prebuild.start([later], 2).join(timeout=60)  # what was started is not started again
    assert started[2:] == [(str(spec("icelake-server", "linear").library), 19)]
    monkeypatch.setenv(kernel_prebuild.ENV, "0")
    assert kernel_prebuild.start([module], 2) is None


def _priority(pid: int) -> tuple[int, str]:
    """The process's niceness, and its autogroup's ("nice N"; "" without autogroups)."""
    group = Path(f"/proc/{pid}/autogroup")
    words = group.read_text().split() if group.exists() else []
    return os.getpriority(os.PRIO_PROCESS, pid), " ".join(words[-2:])


def test_a_background_build_yields_for_its_whole_session_until_a_waiter_raises_it(
    tmp_path, monkeypatch
) -> None:
    """The compilers run at the niceness asked and, where the kernel groups a session's processes
    (autogroups), so does their group: else the group would share the CPU with the caller's
    group as an equal whatever each process's niceness. A caller that then needs the library
    raises them to its own (where it may: root) and gets it. Niceness 7, not the prebuilds'
    19: the child still starts soon on a busy host."""
    spec = tiny_spec(tmp_path / "ext")
    compilers = tmp_path / "cc"
    monkeypatch.setenv("CXX", str(slow_compiler(compilers)))
    child = start_in_background(spec, niceness=7)
    try:
        wait_for(lambda: compiling_pids(compilers) or child.poll() is not None, 300, "a compile")
        assert child.poll() is None, "the build ended before its compile step"
        compiler = compiling_pids(compilers)[0]
        assert os.getsid(compiler) == child.pid != os.getsid(0)  # a session of its own
        own = os.getpriority(os.PRIO_PROCESS, 0)  # niceness adds to the caller's
        assert _priority(compiler) in ((min(own + 7, 19), "nice 7"), (min(own + 7, 19), ""))
        raise_priority(spec, 0)
        if os.geteuid() == 0:
            assert _priority(compiler) in ((own, "nice 0"), (own, ""))
    finally:
        builder._kill_session(child.pid)
    wait_for(lambda: not alive(compiler), 10, "the stopped compiler")

    monkeypatch.delenv("CXX")  # the real compiler now
    start_in_background(spec, niceness=7)
    raise_priority(spec, 0)  # cpu_kernels.build's steps, on the tiny spec
    compile_in_child(spec)  # waits on the build lock, or finds the library built
    assert load_or_compile(spec).add_one(41) == 42
