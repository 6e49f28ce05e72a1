"""`python -m bench.gpu_check.suite_stage [--prebuild] PYTEST_ARGS...`: the check's test suite.

Contract: with `--prebuild`, first builds tgserve's C++ CPU kernels once (printing how long it
took; a failure is printed and the suite still runs), so that no test, under a per-test timeout,
waits for the build lock while a worker compiles; then replaces this process with
`python -m pytest PYTEST_ARGS` (same process group: the runner's timeout still ends it).
"""

from __future__ import annotations

import os
import sys
import time


def main(argv: list[str]) -> int:
    if argv and argv[0] == "--prebuild":
        argv = argv[1:]
        t0 = time.monotonic()
        try:
            from models import cpu_kernels

            built = cpu_kernels.extension() is not None
        except Exception as exc:  # the suite says what fails; this only saves waiting
            built = f"{type(exc).__name__}: {exc}"
        print(f"C++ CPU kernels built: {built} ({time.monotonic() - t0:.0f} s)", flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "pytest", *argv])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
