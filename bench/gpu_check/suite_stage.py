"""`python -m bench.gpu_check.suite_stage [--prebuild] PYTEST_ARGS...`: the check's test suite.

Contract: with `--prebuild`, first builds tgserve's C++ CPU kernels once (printing how long it
took; a failure is printed and the suite still runs), so that no test, under a per-test timeout,
waits for the build lock while a worker compiles, and probes one refusal of the kernels in a
child process (the first GPU machine's workers died where a kernel refuses bad input, which
raises RuntimeError here: the probe prints the child's exit code and the end of its stderr);
then replaces this process with `python -m pytest PYTEST_ARGS` (same process group: the
runner's timeout still ends it).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time

# A Q4_1 row of 20 bytes holds 32 weights, not 64: pack_blocks refuses it (TORCH_CHECK).
REFUSAL_PROBE = """
import torch
from gguf import GGMLQuantizationType as QT
from models.block_linear import BlockWeight
try:
    BlockWeight.pack(torch.zeros(4, 20, dtype=torch.uint8), QT.Q4_1, 64)
except RuntimeError as exc:
    print("refused as RuntimeError:", str(exc).splitlines()[0])
"""


def probe_refusal() -> str:
    """One line: how a refusal of the C++ kernels ends in a child process."""
    try:
        out = subprocess.run(
            [sys.executable, "-X", "faulthandler", "-c", REFUSAL_PROBE],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except subprocess.TimeoutExpired:
        return "C++ refusal probe: timed out after 60 s"
    tail = " | ".join((out.stdout + out.stderr).strip().splitlines()[-12:])
    return f"C++ refusal probe: rc {out.returncode}: {tail}"


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
        if built is True:
            print(probe_refusal(), flush=True)
    os.execv(sys.executable, [sys.executable, "-m", "pytest", *argv])
    return 1  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
