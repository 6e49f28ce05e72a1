"""The kernels compile for the H100 (CUDA sm_90) with Triton's own compiler and ptxas, no GPU
needed (hopper_build.py, in a process without the interpreter). The interpreter that runs
every other test here does not check what only the compiler checks (types that must agree
across branches and loop iterations, the shapes tl.dot accepts, shared memory): this is
what stands between a green CPU run and a kernel that does not build on the GPU."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests.models.triton_attention.hopper_build import ATTENTION

ROOT = Path(__file__).resolve().parents[3]


def test_every_kernel_variant_compiles_for_hopper(tmp_path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(tmp_path)  # an empty cache: every kernel really compiles
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    done = subprocess.run(
        [sys.executable, "-m", "tests.models.triton_attention.hopper_build"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    built = done.stdout.splitlines()
    assert len(built) == len(ATTENTION) + 1, done.stdout  # the attentions and the K/V write
