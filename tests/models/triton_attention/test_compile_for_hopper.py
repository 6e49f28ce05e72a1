"""The kernels compile for the H100 (CUDA sm_90) with Triton's own compiler and ptxas, no GPU
needed (hopper_build.py, in a process without the interpreter). The interpreter that runs
every other test here does not check what only the compiler checks (types that must agree
across branches and loop iterations, the shapes tl.dot accepts, shared memory): this is
what stands between a green CPU run and a kernel that does not build on the GPU."""

from __future__ import annotations

from tests.models.triton_attention.hopper_build import ATTENTION
from tests.models.triton_kernels.hopper_build import compile_in_subprocess


def test_every_kernel_variant_compiles_for_hopper(tmp_path) -> None:
    done = compile_in_subprocess("tests.models.triton_attention.hopper_build", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    built = done.stdout.splitlines()
    # per variant the one-pass attention, the split decode and its merge; and the K/V write
    assert len(built) == 3 * len(ATTENTION) + 1, done.stdout
