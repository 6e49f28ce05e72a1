"""The packed linear kernel (models/cpu_kernels/linear.cpp) against `F.linear` on one model's
projection shapes as the C++ step runs them (qkv, o, gate-up, down), in this process: `python -m bench.linear_kernel --m 1,64,2048`.

Contract: for each M it prints (1) a forward's linears over `--layers` distinct (cold) weight
copies and the LM head, packed kernel vs `F.linear` over the same weights, as milliseconds and
GFLOP/s, and (2) each projection shape alone with its weight hot in cache. With `--int8` the
packed kernel runs int8 weights (one scale per row, as `--quantization int8`) and its peer is
the packed kernel over the same values in bf16 (`--dequantize`'s path), instead of `F.linear`. Timings are the best
of `--rounds` rounds that interleave the two paths, so a busy machine slows both alike; run it
under the QUIET lock for figures worth quoting. To compare two builds, run it once per tree
(PYTHONPATH=<tree>). A development aid, not part of `tgserve bench`'s reports.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable


def _best(calls: list[tuple[Callable[..., object], tuple]], rounds: int) -> list[float]:
    """Best seconds of each fn(*args), the calls interleaved round by round."""
    best = [float("inf")] * len(calls)
    for fn, fn_args in calls:
        fn(*fn_args)  # warm-up
    for _ in range(rounds):
        for i, (fn, fn_args) in enumerate(calls):
            start = time.perf_counter()
            fn(*fn_args)
            best[i] = min(best[i], time.perf_counter() - start)
    return best


def _step_shapes(linears) -> list[tuple[int, int]]:
    """(N, K) of each matmul the C++ step runs: q/k/v and gate/up fused, as it packs them."""
    fused: dict[str, tuple[int, int]] = {}
    for lin in linears:
        key = {"q_proj": "qkv", "k_proj": "qkv", "v_proj": "qkv", "gate_proj": "gate_up"}.get(
            lin.name, "gate_up" if lin.name == "up_proj" else lin.name
        )
        n, _ = fused.get(key, (0, lin.in_features))
        fused[key] = (n + lin.out_features, lin.in_features)
    return list(fused.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=None, help="HF folder or .gguf (default model)")
    parser.add_argument("--m", default="1,8,64,256,2048", help="rows per call, comma-separated")
    parser.add_argument("--layers", type=int, default=30, help="distinct weight copies")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--int8", action="store_true", help="int8 weights vs the bf16 kernel")
    args = parser.parse_args(argv)

    import torch
    import torch.nn.functional as F

    from bench.model_shapes import layer_linears, lm_head
    from bench.model_source import resolve_model
    from models import cpu_kernels

    ext = cpu_kernels.extension()
    if ext is None:
        raise SystemExit("the C++ kernels are unavailable here")
    config = resolve_model(args.model).config
    shapes = _step_shapes(layer_linears(config))
    head = lm_head(config)
    gen = torch.Generator().manual_seed(0)
    ours_kind, peer_kind = ("int8", "bf16 packed") if args.int8 else ("packed", "F.linear")

    def weight(n: int, k: int) -> tuple[object, object, object | None]:
        """(our operand, the peer's operand, scales) of one random [n, k] weight."""
        if not args.int8:
            w = torch.randn(n, k, generator=gen).bfloat16()
            return ext.pack_linear(w), w, None
        q = torch.randint(-127, 128, (n, k), generator=gen, dtype=torch.int8)
        return ext.pack_linear(q), ext.pack_linear(q.bfloat16()), torch.rand(n, generator=gen)

    def peer(x, w, n: int):
        return ext.linear(x, w, None, n, False) if args.int8 else F.linear(x, w)

    layers = [[weight(n, k) for n, k in shapes] for _ in range(args.layers)]
    head_p, head_w, head_s = weight(head.out_features, head.in_features)
    layer_flops = 2 * sum(n * k for n, k in shapes) * args.layers
    head_flops = 2 * head.params
    kind = "int8 vs bf16" if args.int8 else "bf16"
    print(f"{config.num_layers}-layer model, {kind}, {torch.get_num_threads()} threads; GFLOP/s")
    for m in (int(v) for v in args.m.split(",")):
        xs = {k: torch.randn(m, k, generator=gen).bfloat16() for _, k in shapes}
        xs[head.in_features] = torch.randn(m, head.in_features, generator=gen).bfloat16()

        def ours(xs: dict) -> None:
            for layer in layers:
                for (n, k), (p, _, sc) in zip(shapes, layer, strict=True):
                    ext.linear(xs[k], p, None, n, False, sc)

        def theirs(xs: dict) -> None:
            for layer in layers:
                for (n, k), (_, w, _) in zip(shapes, layer, strict=True):
                    peer(xs[k], w, n)

        x_head, n_head = xs[head.in_features], head.out_features
        fns = [
            (ours, (xs,)),
            (theirs, (xs,)),
            (ext.linear, (x_head, head_p, None, n_head, True, head_s)),
            (peer, (x_head, head_w, n_head)),
        ]
        lo, lf, ho, hf = _best(fns, args.rounds)
        print(
            f"M={m}: {args.layers} layers cold: {ours_kind} {lo * 1e3:.2f} ms "
            f"({m * layer_flops / lo / 1e9:.0f}), {peer_kind} {lf * 1e3:.2f} ms "
            f"({m * layer_flops / lf / 1e9:.0f}); LM head: {ours_kind} {ho * 1e3:.2f} ms "
            f"({m * head_flops / ho / 1e9:.0f}), {peer_kind} {hf * 1e3:.2f} ms "
            f"({m * head_flops / hf / 1e9:.0f})"
        )
        hot = []
        for (n, k), (p, w, sc) in zip(shapes, layers[0], strict=True):
            x = xs[k]
            to, tf = _best(
                [(ext.linear, (x, p, None, n, False, sc)), (peer, (x, w, n))], 4 * args.rounds
            )
            hot.append(f"{n}x{k} {2 * m * n * k / to / 1e9:.0f} vs {2 * m * n * k / tf / 1e9:.0f}")
        print(f"  hot, {ours_kind} vs {peer_kind}: " + ", ".join(hot))


if __name__ == "__main__":
    main()
