"""GGUF blocks as stored against the dense bf16 kernel, one linear layer at a time, in one process.

`python -m bench.block_kernels [--rows 1,64,2048] [--threads N] [--reps 20]` times, for each of
SmolLM2-135M's linear shapes in the type the default model stores them (Q4_1 qkv 960x576, gate-up
3072x576, down 576x1536, o 576x576; the Q8_0 tied LM head 49152x576, float32 out), the C++
block kernel (`block_linear`, what the default model runs) and the dense packed kernel over the
same weights dequantised to bf16 (`linear`, what `--dequantize` runs), on the same bf16
activations. Prints one JSON line per (shape, rows): best-of-`reps` microseconds of each and
their ratio (dense / blocks: > 1 means the blocks are faster). Weights: seeded N(0, 0.02),
quantised by the gguf package. The LM head is skipped above 512 rows (a step only runs it on the
rows it samples).
"""

from __future__ import annotations

import argparse
import json
import time
from functools import partial

import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from models import cpu_kernels

SHAPES = (  # name, type, N, K
    ("qkv", QT.Q4_1, 960, 576),
    ("gate_up", QT.Q4_1, 3072, 576),
    ("down", QT.Q4_1, 576, 1536),
    ("o", QT.Q4_1, 576, 576),
    ("lm_head", QT.Q8_0, 49152, 576),
)


def best_us(fn, reps: int) -> float:
    fn()  # warm: caches, the OpenMP pool
    best = float("inf")
    for _ in range(reps):
        start = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - start)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,64,2048", help="comma-separated M values")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    parser.add_argument("--reps", type=int, default=20)
    args = parser.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    ext = cpu_kernels.extension()
    if ext is None:
        raise SystemExit("tgserve's C++ CPU kernels are unavailable here")
    gen = torch.Generator().manual_seed(0)
    for name, qtype, n, k in SHAPES:
        raw = quantize((torch.randn(n, k, generator=gen) * 0.02).numpy(), qtype)
        blocks = ext.pack_blocks(torch.from_numpy(raw), int(qtype), k)
        dense = ext.pack_linear(torch.from_numpy(dequantize(raw, qtype)).bfloat16().contiguous())
        float_out = name == "lm_head"
        for m in (int(v) for v in args.rows.split(",")):
            if float_out and m > 512:
                continue
            x = torch.randn(m, k, generator=gen).bfloat16()
            reps = max(3, min(args.reps, int(4e9 / (m * n * k))))
            run_blocks = partial(ext.block_linear, x, blocks, int(qtype), n, None, float_out)
            t_blocks = best_us(run_blocks, reps)
            t_dense = best_us(partial(ext.linear, x, dense, None, n, float_out), reps)
            row = {"layer": name, "type": qtype.name, "n": n, "k": k, "rows": m}
            row |= {"blocks_us": round(t_blocks, 1), "dense_us": round(t_dense, 1)}
            row |= {
                "dense_over_blocks": round(t_dense / t_blocks, 3),
                "threads": torch.get_num_threads(),
            }
            print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
