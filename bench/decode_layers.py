"""Where a batch-1 decode step of a GGUF served as stored spends its time, matrix by matrix.

`python -m bench.decode_layers --model FILE.gguf [--passes 5] [--tokens 32]` loads the file as
tgserve serves it (its loader, blocks kept as stored, `--dtype` activations: bfloat16 unless
said) and
1. times every block linear layer of the model at M = 1 in forward order (the LM head with its
   float32 output, as the step runs it), one kernel call each, `passes` times: the matrices
   together are far larger than the L3, so each call reads its weights from memory as a decode
   step does (cold). Per group (role, type, shape): the median over passes of the group's
   milliseconds per token, its bytes and its GB/s;
2. frees that model, loads an Engine of the same file and times a real greedy decode of
   `tokens` tokens (after a 1-token run: the difference of the two
   generates over `tokens`), so step - matrices = everything else (attention, norms, sampling,
   the engine);
3. runs the machine's read probe (bench.machine_limits.probe_read_gb_s) for the bound.
Prints one JSON line per group, then a total line. A diagnostic: `tgserve bench latency` is the
figure of record.
"""

from __future__ import annotations

import argparse
import gc
import json
import re
import statistics
import time
from collections import defaultdict

import torch

from bench.machine_limits import probe_read_gb_s
from models import cpu_kernels
from models.activation_quant import Q8Linear
from models.block_linear import BlockLinear


def linear_groups(model: torch.nn.Module) -> list[tuple[str, BlockLinear | Q8Linear]]:
    """(group key, layer) for each block linear layer (GGUF blocks, or their int8-activation
    panels), in forward (module) order."""
    out = []
    for name, module in model.named_modules():
        if isinstance(module, BlockLinear):
            w = module.block_weight
            kind = w.type_name
        elif isinstance(module, Q8Linear):
            w = module.q8_weight
            kind = f"q8x{w.qtype.name}"
        else:
            continue
        role = re.sub(r"^.*\.", "", name)
        out.append((f"{role} {kind} {w.out_features}x{w.in_features}", module))
    return out


def weight_bytes(layer: BlockLinear | Q8Linear) -> int:
    return (layer.q8_weight if isinstance(layer, Q8Linear) else layer.block_weight).nbytes


def time_pass(
    ext, layers: list[tuple[str, BlockLinear]], xs: dict[int, torch.Tensor], clock=time.perf_counter
) -> dict:
    """Seconds per group of one forward-order pass, one call per layer (by `clock`)."""
    seconds: dict[str, float] = defaultdict(float)
    for key, layer in layers:
        float_out = key.startswith("lm_head")
        x = xs[layer.in_features]
        if isinstance(layer, Q8Linear):
            start = clock()
            layer.apply(x, float_out)
        else:
            w = layer.block_weight
            start = clock()
            ext.block_linear(x, w.packed, w.type_id, w.out_features, None, float_out)
        seconds[key] += clock() - start
    return seconds


def decode_ms_per_token(engine, tokens: int) -> float:
    from engine import SamplingParams

    prompt = [[1 + i for i in range(16)]]

    def run(n: int) -> float:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        start = time.perf_counter()
        engine.generate(prompt, params)
        return time.perf_counter() - start

    run(2)  # warm
    return (statistics.median(run(1 + tokens) - run(1) for _ in range(3))) / tokens * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a GGUF file (served as stored)")
    parser.add_argument("--passes", type=int, default=5)
    parser.add_argument("--tokens", type=int, default=32, help="decode tokens for the step time")
    parser.add_argument("--dtype", choices=("bfloat16", "float32"), default="bfloat16")
    args = parser.parse_args()
    from engine import Engine, EngineConfig
    from models.loader import load_model

    ext = cpu_kernels.extension()
    if ext is None:
        raise SystemExit("tgserve's C++ CPU kernels are unavailable here")
    # The model as the engine loads it (same loader, dtype, blocks kept as stored), loaded here:
    # the engine's own model is not bench's to reach. Timed, then freed before the engine loads.
    model, _ = load_model(args.model, args.dtype, "cpu")
    layers = linear_groups(model)
    if not layers:
        raise SystemExit(f"{args.model}: no layer is kept as stored")
    gen = torch.Generator().manual_seed(0)
    xs = {
        k: torch.randn(1, k, generator=gen).to(getattr(torch, args.dtype))
        for k in {layer.in_features for _, layer in layers}
    }
    time_pass(ext, layers, xs)  # warm: the OpenMP pool
    passes = [time_pass(ext, layers, xs) for _ in range(args.passes)]
    nbytes: dict[str, int] = defaultdict(int)
    count: dict[str, int] = defaultdict(int)
    for key, layer in layers:
        nbytes[key] += weight_bytes(layer)
        count[key] += 1
    del model, layers
    gc.collect()
    engine = Engine.from_model(args.model, EngineConfig(dtype=args.dtype))
    total_ms = statistics.median(sum(p.values()) for p in passes) * 1e3
    for key in nbytes:
        ms = statistics.median(p[key] for p in passes) * 1e3
        row = {"group": key, "layers": count[key], "ms_per_token": round(ms, 2)}
        row |= {"mb": round(nbytes[key] / 1e6, 1), "gb_s": round(nbytes[key] / ms / 1e6, 1)}
        print(json.dumps(row | {"share_of_matrices": round(ms / total_ms, 3)}), flush=True)
    step_ms = decode_ms_per_token(engine, args.tokens)
    bound = max(probe_read_gb_s(), default=None)
    all_bytes = sum(nbytes.values())
    total = {
        "group": "total",
        "matrices_ms": round(total_ms, 2),
        "matrices_gb_s": round(all_bytes / total_ms / 1e6, 1),
        "matrices_mb": round(all_bytes / 1e6, 1),
        "decode_step_ms": round(step_ms, 2),
        "other_ms": round(step_ms - total_ms, 2),
        "probe_gb_s": None if bound is None else round(bound, 1),
        "bound_step_ms": None if bound is None else round(all_bytes / bound / 1e6, 2),
    }
    print(json.dumps(total), flush=True)


if __name__ == "__main__":
    main()
