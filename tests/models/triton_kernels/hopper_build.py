"""Compiles the fused kernels for the H100 (CUDA sm_90) with Triton's compiler and ptxas, no
GPU needed: `python -m tests.models.triton_kernels.hopper_build` prints one line per kernel
built and exits non-zero at the first that does not build. Like the attention kernels'
(tests/models/triton_attention/hopper_build.py), in a process without TRITON_INTERPRET.
Shapes: Llama-3-8B's in bfloat16 (hidden 4096, 32 / 8 heads of 128, intermediate 14336,
vocabulary 128256) and an odd float32 one."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import triton
from triton.compiler import ASTSource

from models.triton_kernels import invariant_matmul, rms_norm, rotary, row_softmax, silu_mul
from tests.models.triton_attention.hopper_build import HOPPER, HOPPER_SHARED_BYTES

ROOT = Path(__file__).resolve().parents[3]


def compile_in_subprocess(module: str, cache_dir: Path) -> subprocess.CompletedProcess:
    """Runs `python -m module` (a hopper build) without TRITON_INTERPRET and with an empty
    Triton cache, so every kernel really compiles; for the compile tests."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env["TRITON_CACHE_DIR"] = str(cache_dir)
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    command = [sys.executable, "-m", module]
    return subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)


def build(kernel, pointers: dict[str, str], constants: dict, floats: tuple[str, ...] = ()) -> str:
    """`pointers`: argument name -> element type; `floats`: fp32 scalars; other scalars i32."""
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = "*" + pointers[name]
        else:
            signature[name] = "fp32" if name in floats else "i32"
    compiled = triton.compile(ASTSource(kernel, signature, constexprs=constants), target=HOPPER)
    if not compiled.asm.get("cubin"):
        raise RuntimeError(f"{kernel.__name__}: no cubin")
    if compiled.metadata.shared > HOPPER_SHARED_BYTES:
        raise RuntimeError(f"{kernel.__name__}: {compiled.metadata.shared} bytes of shared memory")
    return f"{kernel.__name__} {pointers} {constants} shared={compiled.metadata.shared}"


def _all(dtype: str, names: tuple[str, ...]) -> dict[str, str]:
    return dict.fromkeys(names, dtype)


def variants() -> list[tuple]:
    out = []
    for dtype, hidden in (("bf16", 4096), ("fp32", 130)):
        for residual in (False, True):
            ptrs = _all(dtype, ("x_ptr", "res_ptr", "w_ptr", "out_ptr", "res_out_ptr"))
            consts = {"H": hidden, "BLOCK": triton.next_power_of_2(hidden)}
            out.append((rms_norm._rms_norm_kernel, ptrs, consts | {"HAS_RESIDUAL": residual}))
    for dtype, (hq, hk, half) in (("bf16", (32, 8, 64)), ("fp32", (3, 1, 12))):
        ptrs = _all(dtype, ("q_ptr", "k_ptr", "q_out_ptr", "k_out_ptr", "cos_ptr", "sin_ptr"))
        consts = {"HQ": hq, "HK": hk, "HALF": half}
        consts |= {k + "_P": triton.next_power_of_2(v) for k, v in consts.items()}
        out.append((rotary._rotary_kernel, ptrs, consts))
    for dtype, inner in (("bf16", 14336), ("fp32", 77)):
        block = min(silu_mul.BLOCK, triton.next_power_of_2(inner))
        ptrs = _all(dtype, ("x_ptr", "out_ptr"))
        out.append((silu_mul._silu_mul_kernel, ptrs, {"INNER": inner, "BLOCK": block}))
    for log in (False, True):
        ptrs = _all("fp32", ("x_ptr", "t_ptr", "out_ptr"))
        consts = {"V": 128256, "BLOCK": row_softmax.BLOCK, "HAS_TEMPERATURE": not log}
        out.append((row_softmax._row_softmax_kernel, ptrs, consts | {"LOG": log}))
    for dtype in ("bf16", "fp32"):
        ptrs = _all(dtype, ("x_ptr", "w_ptr", "b_ptr", "out_ptr"))
        consts = {"BLOCK_M": invariant_matmul.BLOCK_M, "BLOCK_N": invariant_matmul.BLOCK_N}
        consts |= {"BLOCK_K": invariant_matmul.BLOCK_K, "HAS_BIAS": True}
        consts |= {"PRECISION": "ieee" if dtype == "fp32" else "tf32", "INTERPRETED": False}
        out.append((invariant_matmul._invariant_matmul_kernel, ptrs, consts))
    return out


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("run without TRITON_INTERPRET: interpreted kernels do not compile")
    for kernel, pointers, constants in variants():
        print(build(kernel, pointers, constants, floats=("eps",)), flush=True)


if __name__ == "__main__":
    main()
