"""The wheels the GPU check brings (gpu/wheels.txt) and the packages the GPU image already holds
(gpu/image-packages.txt) cover tgserve's runtime dependencies and every brought wheel's own.

Why: the first runs of the check on a GPU machine lost every benchmark to an import error, twice
(fastapi 0.165 needs opentelemetry-api; the server needs fastapi-offline), which a CPU can tell
beforehand. Oracle: pyproject's `dependencies` and the installed distributions' own metadata
(`importlib.metadata.requires`, the same Requires-Dist lines the wheels carry), with their
environment markers evaluated for the GPU image's Python (3.12, Linux x86-64).
"""

from __future__ import annotations

import importlib.metadata as md
import re
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
GPU_PYTHON = {"python_version": "3.12", "python_full_version": "3.12.3", "sys_platform": "linux"}
GPU_PYTHON |= {"platform_system": "Linux", "platform_machine": "x86_64", "extra": ""}


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def listed(path: Path) -> dict[str, str]:
    """canonical name -> the line (name, or name==version) of a one-per-line list."""
    lines = (line.strip() for line in path.read_text().splitlines())
    return {
        canonical(re.split(r"[=<>!~ ]", line)[0]): line for line in lines if line and line[0] != "#"
    }


def needed_on_the_gpu(requirement: str) -> str | None:
    """The requirement's canonical name when the GPU image's Python needs it, else None."""
    req = Requirement(requirement)
    if req.marker is not None and not req.marker.evaluate(GPU_PYTHON):
        return None
    return canonical(req.name)


def test_every_runtime_dependency_is_in_the_image_or_brought() -> None:
    brought, image = listed(ROOT / "gpu/wheels.txt"), listed(ROOT / "gpu/image-packages.txt")
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    missing = [d for d in deps if (n := needed_on_the_gpu(d)) and n not in brought | image]
    assert not missing, f"add to gpu/wheels.txt (gpu/fetch-wheels.sh then brings them): {missing}"


def test_every_brought_wheel_finds_what_it_requires() -> None:
    brought, image = listed(ROOT / "gpu/wheels.txt"), listed(ROOT / "gpu/image-packages.txt")
    gaps = {}
    for name, line in brought.items():
        try:
            requires = md.requires(name) or []
        except md.PackageNotFoundError:
            pytest.fail(f"{line} is brought to the GPU but not installed here to read its needs")
        need = {n for r in requires if (n := needed_on_the_gpu(r))}
        if need - brought.keys() - image.keys():
            gaps[line] = sorted(need - brought.keys() - image.keys())
    assert not gaps, f"these wheels would not import on the GPU image: {gaps}"


def test_brought_versions_are_the_ones_tested_here() -> None:
    """A pinned wheel is the version CI runs (constraints.txt), so the GPU runs the same code."""
    pins = {
        canonical(k): v
        for k, _, v in (line.partition("==") for line in listed(ROOT / "constraints.txt").values())
    }
    brought = listed(ROOT / "gpu/wheels.txt")
    differ = {
        line: pins[name]
        for name, line in brought.items()
        if name in pins and line.partition("==")[2] != pins[name]
    }
    assert not differ, f"gpu/wheels.txt pins differ from constraints.txt: {differ}"
