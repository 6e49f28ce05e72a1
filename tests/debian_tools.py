"""Debian command-line tools the tests drive (promtool, chromium), installed where missing.

`debian_tool(command, package)` returns the command's path; where it is missing it installs the
Debian package with apt-get (as root, once per session, as tests/deploy does with docker). A
machine where apt cannot install anything (not root, no apt-get) skips the test with that
reason; an install that fails is a test failure, never a skip.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess

import pytest


@functools.cache
def _apt_updated() -> None:
    _apt("update", "-qq", timeout=600)


def _apt(*args: str, timeout: float) -> None:
    done = subprocess.run(
        ["apt-get", "-o", "DPkg::Lock::Timeout=600", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "DEBIAN_FRONTEND": "noninteractive"},
    )
    if done.returncode != 0:
        pytest.fail(f"apt-get {' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")


def debian_tool(command: str, *packages: str) -> str:
    """The path of `command`, installing `packages` with apt-get where it is missing."""
    found = shutil.which(command)
    if found is not None:
        return found
    if os.geteuid() != 0 or shutil.which("apt-get") is None:
        pytest.skip(f"needs {command} (Debian's {' '.join(packages)}); apt-get needs root here")
    _apt_updated()
    _apt("install", "-y", "-qq", "--no-install-recommends", *packages, timeout=900)
    found = shutil.which(command)
    if found is None:
        pytest.fail(f"apt-get installed {' '.join(packages)} but there is no {command}")
    return found
