"""Compiles the Triton kernels for the H100 (CUDA sm_90) with Triton's compiler and ptxas, no
GPU needed: `python -m tests.models.triton_attention.hopper_build` prints one line per
kernel built and exits non-zero at the first that does not build. Run in a process of its
own, without TRITON_INTERPRET (under it, triton.language's helpers are interpreted and
cannot be compiled), by test_compile_for_hopper.py."""

from __future__ import annotations

import os

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from models.triton_attention import kv_write, paged_attention, split_decode

HOPPER = GPUTarget("cuda", 90, 32)
HOPPER_SHARED_BYTES = 227 * 1024  # the most one block may use on an H100
INDEX_POINTERS = {"tables_ptr": "*i64", "seq_lens_ptr": "*i64", "query_start_ptr": "*i64"}
INDEX_POINTERS |= {"tile_seq_ptr": "*i32", "tile_first_ptr": "*i32", "slots_ptr": "*i64"}
INDEX_POINTERS |= {"acc_ptr": "*fp32", "stats_ptr": "*fp32"}  # the split decode's partials
TRITON_TYPES = {torch.bfloat16: "bf16", torch.float32: "fp32"}
# An fp8 cache (models/kv_fp8.py): e4m3 rows, their scales read as float32 words.
FP8_POINTERS = {"k_ptr": "*fp8e4nv", "v_ptr": "*fp8e4nv", "ks_ptr": "*fp32", "vs_ptr": "*fp32"}
# (dtype, block size, query heads per KV head, head dim, sliding window, fp8 K/V): Llama-3-8B's
# shape in bfloat16, padded heads and dims with a window over an fp8 cache, float32 (IEEE
# dots) — a few, as each build takes seconds of CPU
ATTENTION = [
    (torch.bfloat16, 16, 4, 128, False, False),
    (torch.bfloat16, 1, 3, 80, True, True),
    (torch.float32, 32, 8, 64, True, False),
]


def build(kernel, dtype: torch.dtype, constants: dict) -> str:
    """Tensors other than the index ones are `dtype` (the cache's e4m3 with FP8); plain
    integers are int32 scalars."""
    pointers = INDEX_POINTERS | (FP8_POINTERS if constants.get("FP8") else {})
    signature = {}
    for name in kernel.arg_names:
        if name in constants:
            signature[name] = "constexpr"
        elif name.endswith("_ptr"):
            signature[name] = pointers.get(name, "*" + TRITON_TYPES[dtype])
        else:
            signature[name] = "fp32" if name == "scale_log2" else "i32"
    source = ASTSource(kernel, signature, constexprs=constants)
    compiled = triton.compile(source, target=HOPPER)
    if not compiled.asm.get("cubin"):
        raise RuntimeError(f"{kernel.__name__}: no cubin")
    if compiled.metadata.shared > HOPPER_SHARED_BYTES:
        raise RuntimeError(f"{kernel.__name__}: {compiled.metadata.shared} bytes of shared memory")
    return f"{kernel.__name__} {TRITON_TYPES[dtype]} {constants} shared={compiled.metadata.shared}"


def main() -> None:
    if os.environ.get("TRITON_INTERPRET", "0") not in ("", "0"):
        raise SystemExit("run without TRITON_INTERPRET: interpreted kernels do not compile")
    for dtype, block_size, group, head_dim, sliding, fp8 in ATTENTION:
        constants = paged_attention.kernel_constants(
            dtype, False, group, head_dim, block_size, sliding
        )
        print(
            build(paged_attention._paged_attention_kernel, dtype, constants | {"FP8": fp8}),
            flush=True,
        )
        constants = split_decode.split_constants(dtype, False, group, head_dim, block_size, sliding)
        constants |= {"FP8": fp8}
        print(build(split_decode._split_kernel, dtype, constants), flush=True)
        constants = split_decode.merge_constants(head_dim)
        print(build(split_decode._merge_kernel, dtype, constants), flush=True)
    constants = kv_write.kernel_constants(block_size=16, kv_heads=8, head_dim=128)
    print(build(kv_write._write_kv_kernel, torch.bfloat16, constants), flush=True)


if __name__ == "__main__":
    main()
