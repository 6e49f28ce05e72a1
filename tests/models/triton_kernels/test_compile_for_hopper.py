"""The fused kernels compile for the H100 (CUDA sm_90) with Triton's compiler and ptxas, no GPU
needed (hopper_build.py, in a process without the interpreter): the interpreter that runs the
other tests here does not check what only the compiler checks (types agreeing across
branches and loop iterations, the shapes tl.dot accepts, shared memory)."""

from __future__ import annotations

from tests.models.triton_kernels.hopper_build import compile_in_subprocess, variants


def test_every_kernel_variant_compiles_for_hopper(tmp_path) -> None:
    done = compile_in_subprocess("tests.models.triton_kernels.hopper_build", tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    assert len(done.stdout.splitlines()) == len(variants()), done.stdout
