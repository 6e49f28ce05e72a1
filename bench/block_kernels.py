"""GGUF blocks as stored against the dense kernel, one linear layer at a time, in one process.

`python -m bench.block_kernels [--rows 1,2,4,5,8,32,64,128] [--dtype float32,bfloat16]
[--types Q4_1,Q8_0,Q4_K,Q6_K] [--runs 7] [--threads N] [--march haswell]` times, for each of
SmolLM2-135M's linear shapes (qkv 960x576, gate-up 3072x576, down 576x1536, o 576x576;
`--lm-head` adds the tied head 49152x576, float32 out, up to 512 rows) stored in each type, the
C++ block kernel (`block_linear`, what weights kept as stored run) and the dense packed kernel
over the same weights dequantised to the activations' dtype (`linear`, what `--dequantize`
runs), on the same activations, in the native build or the one `--march` names (every ISA
build a CPU can run, on one host: the same sources, `models.cpu_kernels.build(march)`). The
kernels alternate call by call inside each run (a busy machine slows all alike): the R-row
calls of both and, for R > 1, the same layer's one-row calls of both; a run times `--calls`
calls of each and the figure is the median of `--runs` runs.

Prints one JSON line per (dtype, type, rows, layer): GFLOP/s of each kernel from the median
run (`blocks_gflops`, `dense_gflops`) and from the best single call (`*_best_gflops`: a call
no other process preempted, the steadier figure on a shared machine), `blocks_over_dense`
(`_best`): the blocks' rate as a fraction of the dense kernel's (>= 1.0: at least the dense
rate), and `blocks_over_one_row` / `dense_over_one_row`: the time of one call of R rows over
one call of one row (a speculative verify of k + 1 rows costs that many decode steps' worth of
this layer; 1.0 would be free rows); then one line per (dtype, type, rows) over the four layer
shapes together (`layer: "all"`), each with the 1-minute load average at its start (compare the
ratios of one process). Weights: seeded N(0, 0.02), quantised by the gguf package (K-quants by
bench/kquantize.py, K rounded up to whole 256-wide super-blocks: 576 -> 768).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from collections.abc import Callable
from functools import partial

import torch
from gguf import GGMLQuantizationType as QT
from gguf.quants import dequantize, quantize

from bench.kquantize import quantize_k
from models import cpu_kernels

LAYERS = (("qkv", 960, 576), ("gate_up", 3072, 576), ("down", 576, 1536), ("o", 576, 576))
LM_HEAD = ("lm_head", 49152, 576)
KQUANTS = {QT.Q4_K, QT.Q5_K, QT.Q6_K}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def width(qtype: QT) -> int:
    return 256 if qtype in KQUANTS else 32


def quantized(values: torch.Tensor, qtype: QT):
    array = values.numpy()
    return quantize_k(array, qtype) if qtype in KQUANTS else quantize(array, qtype)


def time_interleaved_us(
    fns: dict[str, Callable[[], object]], runs: int, calls: int
) -> dict[str, float]:
    """Microseconds per call of each of `fns`, the calls alternating: the median over `runs`
    of each run's mean (`name`), and the best single call (`name_best`: a call no other
    process preempted)."""
    for fn in fns.values():
        fn()  # warm: caches, the OpenMP pool
    means: dict[str, list[float]] = {name: [] for name in fns}
    best = dict.fromkeys(fns, float("inf"))
    for _ in range(runs):
        spent = dict.fromkeys(fns, 0.0)
        for _ in range(calls):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                took = time.perf_counter() - start
                spent[name] += took
                best[name] = min(best[name], took)
        for name in fns:
            means[name].append(spent[name] / calls * 1e6)
    out = {name: statistics.median(values) for name, values in means.items()}
    return out | {f"{name}_best": t * 1e6 for name, t in best.items()}


def rates(flop: float, us: dict[str, float]) -> dict[str, float]:
    """GFLOP/s of each kernel (median and best), the blocks' rate over the dense one's, and
    (where the one-row calls were timed) each kernel's R-row call over its one-row call."""
    keys = ("blocks", "dense", "blocks_best", "dense_best")
    out = {f"{key}_gflops": round(flop / us[key] / 1e3, 1) for key in keys}
    out["blocks_over_dense"] = round(us["dense"] / us["blocks"], 3)
    out["blocks_over_dense_best"] = round(us["dense_best"] / us["blocks_best"], 3)
    for kernel in ("blocks", "dense"):
        if f"{kernel}_1" in us:
            out[f"{kernel}_over_one_row"] = round(us[kernel] / us[f"{kernel}_1"], 3)
    return out


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", default="1,2,4,5,8,32,64,128", help="comma-separated M values")
    parser.add_argument("--dtype", default="float32,bfloat16", help="activation dtypes")
    parser.add_argument("--types", default="Q4_1,Q4_0,Q8_0,Q4_K,Q6_K", help="GGML types")
    parser.add_argument("--lm-head", action="store_true", help="also the 49152x576 LM head")
    parser.add_argument("--threads", type=int, default=0, help="torch threads (0: torch's choice)")
    parser.add_argument(
        "--march",
        default="native",
        help="the kernels built for this -march (haswell: AVX2, icelake-server: AVX-512 "
        "without BF16, x86-64-v2: scalar), compiled on first use",
    )
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--calls", type=int, default=0, help="calls per run (0: ~20 ms a run)")
    args = parser.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    ext = cpu_kernels.extension() if args.march == "native" else cpu_kernels.build(args.march)
    if ext is None:
        raise SystemExit("tgserve's C++ CPU kernels are unavailable here")
    layers = LAYERS + ((LM_HEAD,) if args.lm_head else ())
    gen = torch.Generator().manual_seed(0)
    for dtype_name in args.dtype.split(","):
        dtype = DTYPES[dtype_name]
        for qtype in (QT[name] for name in args.types.split(",")):
            weights = []
            for name, n, k in layers:
                k = -(-k // width(qtype)) * width(qtype)  # 256-wide types: K rounded up
                raw = quantized(torch.randn(n, k, generator=gen) * 0.02, qtype)
                packed = ext.pack_blocks(torch.from_numpy(raw), int(qtype), k)
                values = torch.from_numpy(dequantize(raw, qtype)).to(dtype).contiguous()
                weights.append((name, n, k, packed, ext.pack_linear(values)))
            for m in (int(v) for v in args.rows.split(",")):
                totals: dict[str, float] = {"flop": 0.0}
                load = round(os.getloadavg()[0], 2)
                for name, n, k, packed, dense in weights:
                    float_out = name == "lm_head"
                    if float_out and m > 512:
                        continue
                    x = torch.randn(m, k, generator=gen).to(dtype)
                    calls = args.calls or max(1, int(4e8 / (2 * m * n * k + 4e6)))
                    fns = {
                        "blocks": partial(
                            ext.block_linear, x, packed, int(qtype), n, None, float_out
                        ),
                        "dense": partial(ext.linear, x, dense, None, n, float_out),
                    }
                    if m > 1:  # the same layer's one-row calls, interleaved with these
                        fns["blocks_1"] = partial(
                            ext.block_linear, x[:1], packed, int(qtype), n, None, float_out
                        )
                        fns["dense_1"] = partial(ext.linear, x[:1], dense, None, n, float_out)
                    times = time_interleaved_us(fns, args.runs, calls)
                    row = {"dtype": dtype_name, "type": qtype.name, "rows": m, "layer": name}
                    row |= {"n": n, "k": k} | rates(2 * m * n * k, times) | {"load": load}
                    print(json.dumps(row), flush=True)
                    if not float_out:
                        totals["flop"] += 2 * m * n * k
                        for key, us in times.items():
                            totals[key] = totals.get(key, 0.0) + us
                row = {"dtype": dtype_name, "type": qtype.name, "rows": m, "layer": "all"}
                row |= rates(totals.pop("flop"), totals)
                row |= {"load": load, "threads": torch.get_num_threads(), "march": args.march}
                print(json.dumps(row), flush=True)


if __name__ == "__main__":
    main()
