"""The C++ paged attention's cost per key at every context length, against the read bound:
`python -m bench.attention_keys [--model M] [--lens 128,1024,4096,8192] [--dtype float32]
[--kv-cache-dtype int8|float16|int8v] [--clock wall|thread]`.

Contract: prints the kernel build that ran (models/cpu_kernels.selected_build, e.g. an AVX2
build forced by TGSERVE_CPU_ISA on an AVX-512 host) and the host's ISA, then for each context
length L, with the model's attention shape (query heads, KV heads, head dim) over a paged
cache of 16-token blocks in shuffled order:
- decode: one query row over L keys (one layer's call), as ns per key and as the fraction of
  the read bound (the K and V bytes of a key, 2 x KV heads x head dim x dtype size, or
  2 x KV heads x (head dim + 4) for int8 rows (models/kv_quant.py), 2 x KV heads x head dim x 2
  for float16 rows (models/kv_half.py), KV heads x (3 head dim + 4) for int8v's float16 K and
  int8 V rows, each read by float32 q, at the best read GB/s of bench/machine_limits.py's probe);
- prefill: a chunk of `--chunk` rows, the last ones of an L-token prompt, each over its own
  causal context (how the engine runs a chunk: one query per row), as ns per (row, key) pair.
Timings are the median of `--rounds` calls after one warm-up (the prefill's fastest call in
brackets: on a shared host the least disturbed one). `--clock thread` times the calling
thread's CPU time instead of the wall clock: at one thread (OMP_NUM_THREADS=1; refused
otherwise) the kernel's OpenMP team is that thread, so other jobs' time slices are not counted
(their cache and core sharing still are). A development aid for the kernel's scaling (a flat
ns/key from 128 to 8,192 keys is the aim), not part of `tgserve bench`'s reports; on a shared
machine compare builds in one command (PYTHONPATH per tree), alternated.
"""

from __future__ import annotations

import argparse
import statistics
import time


def _call_seconds(fn, args: tuple, rounds: int, clock) -> list[float]:
    """Seconds of each of `rounds` calls of fn(*args) by `clock`, after one warm-up call."""
    fn(*args)  # warm-up: first touch, the OpenMP pool
    times = []
    for _ in range(rounds):
        start = clock()
        fn(*args)
        times.append(clock() - start)
    return times


def _kinds(args) -> str:
    """The element types timed: the model's dtype, or K/V rows beside float32 queries."""
    return args.dtype if args.kv_cache_dtype == "auto" else f"{args.kv_cache_dtype} K/V, float32 q"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default model)")
    parser.add_argument("--lens", default="128,1024,4096,8192", help="context lengths")
    parser.add_argument("--dtype", default="float32", choices=["float32", "bfloat16", "float16"])
    parser.add_argument(
        "--kv-cache-dtype", default="auto", choices=["auto", "int8", "float16", "int8v"]
    )
    parser.add_argument("--chunk", type=int, default=256, help="prefill rows per call")
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument(
        "--clock", default="wall", choices=["wall", "thread"], help="thread: one thread's CPU time"
    )
    args = parser.parse_args(argv)

    import torch

    from bench.host_label import host_label
    from bench.machine_limits import probe_read_gb_s
    from bench.model_source import resolve_model
    from models import cpu_kernels
    from models.kv_quant import part_dtypes, quantize_rows, row_bytes

    ext = cpu_kernels.extension()
    if ext is None:
        raise SystemExit("the C++ kernels are unavailable here")
    if args.clock == "thread" and torch.get_num_threads() != 1:
        raise SystemExit(
            f"--clock thread times one thread; this process runs {torch.get_num_threads()} "
            "(set OMP_NUM_THREADS=1)"
        )
    clock = time.thread_time if args.clock == "thread" else time.perf_counter
    config = resolve_model(args.model).config
    heads, kv_heads, head_dim = config.num_heads, config.num_kv_heads, config.head_dim
    dtype = getattr(torch, args.dtype)
    k_kind, v_kind = part_dtypes(args.kv_cache_dtype)  # int8v: float16 K, int8 V rows
    if args.kv_cache_dtype != "auto":
        dtype = torch.float32  # the queries; the cache holds int8 / float16 rows
    cache_dtype = torch.float16 if args.kv_cache_dtype in ("float16", "int8v") else dtype
    key_bytes = kv_heads * sum(row_bytes(head_dim, dtype.itemsize, k) for k in (k_kind, v_kind))
    read_gb_s = max(probe_read_gb_s(), default=float("nan"))
    bound_ns = key_bytes / read_gb_s  # ns per key at the read bound (bytes / (GB/s) = ns)
    print(
        f"build {cpu_kernels.selected_build()} ({ext.__name__}) on {host_label('cpu')}, "
        f"{torch.get_num_threads()} threads, {args.clock} clock; {heads} heads / {kv_heads} KV heads x {head_dim}, "
        f"{_kinds(args)}; read bound {read_gb_s:.1f} GB/s = {bound_ns:.2f} ns/key"
    )
    gen = torch.Generator().manual_seed(0)
    block = 16
    for length in (int(v) for v in args.lens.split(",")):
        blocks = -(-length // block)
        k_cache = torch.randn(blocks, block, kv_heads, head_dim, generator=gen).to(cache_dtype)
        v_cache = torch.randn(blocks, block, kv_heads, head_dim, generator=gen).to(cache_dtype)
        if k_kind == "int8":
            k_cache = quantize_rows(k_cache)
        if v_kind == "int8":
            v_cache = quantize_rows(v_cache)
        table = torch.randperm(blocks, generator=gen).view(1, blocks)
        scale = head_dim**-0.5
        q1 = torch.randn(1, heads, head_dim, generator=gen).to(dtype)
        lens1 = torch.tensor([length])
        decode = statistics.median(
            _call_seconds(
                ext.paged_decode, (q1, k_cache, v_cache, table, lens1, scale, 0), args.rounds, clock
            )
        )
        rows = min(args.chunk, length)
        qc = torch.randn(rows, heads, head_dim, generator=gen).to(dtype)
        lens_c = torch.arange(length - rows + 1, length + 1)
        tables_c = table.expand(rows, blocks).contiguous()
        prefill = _call_seconds(
            ext.paged_decode, (qc, k_cache, v_cache, tables_c, lens_c, scale, 0), args.rounds, clock
        )
        pairs = int(lens_c.sum())
        decode_ns = decode / length * 1e9
        print(
            f"L={length:>5}: decode {decode_ns:7.2f} ns/key ({bound_ns / decode_ns:5.1%} of the "
            f"read bound), prefill {rows} rows {statistics.median(prefill) / pairs * 1e9:6.3f} "
            f"ns/(row, key) (fastest {min(prefill) / pairs * 1e9:6.3f})"
        )


if __name__ == "__main__":
    main()
