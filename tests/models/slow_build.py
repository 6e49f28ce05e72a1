"""Helpers for the kernel-build tests: a compiler that stays in its compile step until told,
a tiny extension that builds in a second, and a look at which processes are still alive.

`slow_compiler(folder)` writes a `CXX` wrapper: a compile (`-c`) writes the wrapper's PID to
`<folder>/compiling.<pid>` and sleeps 600 s before running the real c++; anything else
(torch's version check, the link) runs c++ at once. So a build is caught mid-compile for sure,
with its compiler's PID in hand.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

from models.cpu_kernels.builder import BuildSpec

TINY_SOURCE = r"""
#include <Python.h>
#define CAT_(a, b) a##b
#define CAT(a, b) CAT_(a, b)
#define STR_(a) #a
#define STR(a) STR_(a)
static PyObject* add_one(PyObject*, PyObject* x) { return PyLong_FromLong(PyLong_AsLong(x) + 1); }
static PyMethodDef methods[] = {{"add_one", add_one, METH_O, nullptr}, {nullptr, nullptr, 0, nullptr}};
static PyModuleDef module = {PyModuleDef_HEAD_INIT, STR(TORCH_EXTENSION_NAME), nullptr, -1, methods};
PyMODINIT_FUNC CAT(PyInit_, TORCH_EXTENSION_NAME)(void) { return PyModule_Create(&module); }
"""


def tiny_spec(folder: Path) -> BuildSpec:
    """A one-source extension (Python's headers only: compiles in about a second)."""
    folder.mkdir(parents=True, exist_ok=True)
    source = folder / "add_one.cpp"
    source.write_text(TINY_SOURCE)
    return BuildSpec("tgserve_test_add_one", folder / "build", (str(source),))


def slow_compiler(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    wrapper = folder / "slow-c++"
    wrapper.write_text(
        "#!/bin/sh\n"
        'for arg in "$@"; do\n'
        '  if [ "$arg" = "-c" ]; then echo $$ > "' + str(folder) + '/compiling.$$"; sleep 600; fi\n'
        "done\n"
        'exec c++ "$@"\n'
    )
    wrapper.chmod(0o755)
    return wrapper


def compiling_pids(folder: Path) -> list[int]:
    return [int(p.name.split(".")[1]) for p in folder.glob("compiling.*")]


def alive(pid: int) -> bool:
    """True while `pid` runs (a zombie, dead but not yet reaped, counts as gone)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


def wait_for(condition, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def pids_in_session(session: int) -> list[int]:
    out = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.getsid(int(entry.name)) == session and alive(int(entry.name)):
                    out.append(int(entry.name))
            except ProcessLookupError:
                pass
    return out
