"""int8 and int16 activations (`--activation-quantization int8 | int16`) against the float path
over the same GGUF blocks, one linear layer at a time, in one process.

`python -m bench.q8_kernels [--rows 1,8,32,64,128] [--dtype float32,bfloat16] [--types
Q4_1,Q8_0] [--runs 7] [--threads N]` times, for SmolLM2-135M's four linear shapes
(bench/block_kernels.LAYERS) stored in each type, `q8_linear` (int8 activations, Q8 panels:
models/cpu_kernels/q8_linear.cpp; `q16`: the same panels, int16 activations) and `block_linear`
(what the blocks as stored run without the option), the three alternating call by call
(bench/block_kernels.time_interleaved_us). Prints one JSON line per (dtype, type, rows) over the
four layers together: GFLOP/s of each (`q8_*`, `q16_*`, `float_*`; median run and best single
call) and `q8_over_float` / `q16_over_float` (`_best`): the speed-ups.
"""

from __future__ import annotations

import argparse
import json
import os
from functools import partial

import torch
from gguf import GGMLQuantizationType as QT

from bench.block_kernels import DTYPES, LAYERS, quantized, time_interleaved_us
from models import cpu_kernels
from models.activation_quant import Q8Weight
from models.block_linear import BlockWeight


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,8,32,64,128", help="comma-separated M values")
    parser.add_argument("--dtype", default="float32,bfloat16", help="activation dtypes")
    parser.add_argument("--types", default="Q4_1,Q8_0", help="GGML types: Q4_0, Q4_1, Q8_0")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ext = cpu_kernels.extension()
    if ext is None:
        raise SystemExit("tgserve's C++ CPU kernels are unavailable here")
    gen = torch.Generator().manual_seed(0)
    for qtype in (QT[name] for name in args.types.split(",")):
        weights = []
        for _, n, k in LAYERS:
            raw = torch.from_numpy(quantized(torch.randn(n, k, generator=gen) * 0.02, qtype))
            blocks = BlockWeight.pack(raw, qtype, k)
            weights.append((n, k, blocks, Q8Weight.from_blocks(blocks)))
        for dtype_name in args.dtype.split(","):
            for m in (int(v) for v in args.rows.split(",")):
                load = round(os.getloadavg()[0], 2)
                flop, totals = (
                    0.0,
                    dict.fromkeys(("q8", "q16", "float", "q8_best", "q16_best", "float_best"), 0.0),
                )
                for n, k, blocks, q8 in weights:
                    x = torch.randn(m, k, generator=gen).to(DTYPES[dtype_name])
                    times = time_interleaved_us(
                        {
                            "q8": partial(ext.q8_linear, x, q8.packed, q8.kind, n, None, False),
                            "q16": partial(
                                ext.q8_linear, x, q8.packed, q8.with_bits(16).kind, n, None, False
                            ),
                            "float": partial(
                                ext.block_linear, x, blocks.packed, int(qtype), n, None, False
                            ),
                        },
                        args.runs,
                        max(1, int(4e8 / (2 * m * n * k + 4e6))),
                    )
                    flop += 2 * m * n * k
                    for key, us in times.items():
                        totals[key] += us
                row = {"dtype": dtype_name, "type": qtype.name, "rows": m, "isa": ext.q8_isa()}
                for kernel in ("q8", "q16", "float"):
                    row[f"{kernel}_gflops"] = round(flop / totals[kernel] / 1e3, 1)
                    row[f"{kernel}_best_gflops"] = round(flop / totals[f"{kernel}_best"] / 1e3, 1)
                for kernel in ("q8", "q16"):
                    row[f"{kernel}_over_float"] = round(totals["float"] / totals[kernel], 3)
                    best = totals["float_best"] / totals[f"{kernel}_best"]
                    row[f"{kernel}_over_float_best"] = round(best, 3)
                row |= {"load": load, "threads": torch.get_num_threads()}
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
