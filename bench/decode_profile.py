"""Where a batch-1 decode step's time goes, op kind by op kind, against the machine's read bound.

`python -m bench.decode_profile [--model FILE.gguf] [--dtype float32] [--context 192]
[--threads N] [--passes 7] [--tokens 32] [--activation-quantization int8]` loads the file as tgserve serves it (its loader,
GGUF blocks kept as stored, or their int8-activation panels with `--activation-quantization
int8`; the default model when no --model) and times, at batch 1:
- each linear op kind (qkv, o, gate_up, down over all layers, and the LM head with its float32
  output): one kernel call per layer in forward order, as the step calls them, median of
  `passes` passes (bench/decode_layers.py's timing; the matrices together are far larger than
  the L3, so each call reads its weights from memory as a decode step does);
- attention: the C++ paged decode kernel of one query row over `context` keys of shuffled
  16-token blocks, once per layer;
- the C++ step: FusedDecoder.hidden for one row at that context (the embedding row, the rotary
  tables, the C++ call running every layer), and FusedDecoder.logits; where its layers run in
  one OpenMP region per layer (models/cpu_kernels/step_region.h), also the op-by-op step (its
  `one_region` off), the two alternating call by call;
- the engine's greedy decode of `tokens` tokens after a prompt of `context - tokens / 2`
  tokens (so the mean context is `context`): ms per token from the difference of two generates.
Then: `elementwise` = the C++ step - its matrices - attention (RMS norms, rotary, residual adds,
SwiGLU, the K/V writes, the embedding row and the step's set-up), and `engine` = the decode
step - the C++ step - the logits (scheduling, sampling, the Python around the C++ calls). The
linear rows include a Python call per layer (a few us each) that the C++ step does not pay.

Prints the kernel build, the host's ISA and the thread count, then one row per op kind: ms per
token, share of the step, MB read per token, GB/s and that as a fraction of the read probe's
best GB/s (bench/machine_limits.py). A diagnostic; `tgserve bench latency` is the figure of
record. On a shared host, compare the shares, and run builds back to back.
"""

from __future__ import annotations

import argparse
import gc
import statistics
import time

import torch

from bench.decode_layers import linear_groups, time_pass, weight_bytes

ROLES = ("qkv_proj", "o_proj", "gate_up_proj", "down_proj", "lm_head")


CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


def _median_ms(fn, rounds: int, clock) -> float:
    fn()  # warm: first touch, the OpenMP pool
    times = []
    for _ in range(rounds):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times) * 1e3


def time_attention(ext, config, context: int, rounds: int, clock) -> tuple[float, int]:
    """ms per token of the layers' decode attention over `context` keys, and the K/V bytes."""
    gen = torch.Generator().manual_seed(0)
    kvh, d, block = config.num_kv_heads, config.head_dim, 16
    blocks = -(-context // block)
    k = torch.randn(blocks, block, kvh, d, generator=gen)
    v = torch.randn(blocks, block, kvh, d, generator=gen)
    table = torch.randperm(blocks, generator=gen).view(1, blocks)
    q = torch.randn(1, config.num_heads, d, generator=gen)
    lens = torch.tensor([context])
    ms = _median_ms(lambda: ext.paged_decode(q, k, v, table, lens, d**-0.5, 0), rounds, clock)
    return ms * config.num_layers, 2 * kvh * d * 4 * context * config.num_layers


def time_fused_step(
    model, config, context: int, rounds: int, clock
) -> tuple[float, float, float | None]:
    """ms of FusedDecoder.hidden for one decode row at `context`, of its logits, and of hidden
    with its one-region step off (op by op; None where the layers never run in one region),
    the two settings alternating call by call so that both see the same load."""
    from models import allocate_kv_cache
    from models.attention import AttentionMetadata
    from models.cpu_kernels.fused_decoder import FusedDecoder

    block = 16
    blocks = -(-context // block)
    kv = allocate_kv_cache(config, blocks, block, model.model.norm.weight.dtype, "cpu")
    fused = FusedDecoder.build(model, kv)
    if fused is None:
        raise SystemExit("the fused C++ step does not run this model")
    meta = AttentionMetadata.build([list(range(blocks))], [context], [1], block_size=block)
    ids, positions = torch.tensor([1]), torch.tensor([context - 1])
    h = fused.hidden(ids, positions, meta)
    logits_ms = _median_ms(lambda: fused.logits(h), rounds, clock)
    times: dict[bool, list[float]] = {True: [], False: []}
    for one_region in (False, True) * rounds if fused.runs_one_region else (True,) * rounds:
        fused.one_region = one_region
        start = clock()
        fused.hidden(ids, positions, meta)
        times[one_region].append(clock() - start)
    fused.one_region = True
    by_op = statistics.median(times[False]) * 1e3 if times[False] else None
    return statistics.median(times[True]) * 1e3, logits_ms, by_op


def engine_decode_ms(
    model_path: str, dtype: str, context: int, tokens: int, clock, activations: str | None
) -> float:
    from engine import Engine, EngineConfig, SamplingParams

    config = EngineConfig(dtype=dtype, activation_quantization=activations or "none")
    engine = Engine.from_model(model_path, config)
    prompt = [[1 + i % 1000 for i in range(max(1, context - tokens // 2))]]

    def run(n: int) -> float:
        params = SamplingParams(max_tokens=n, temperature=0.0, ignore_eos=True)
        start = clock()
        engine.generate(prompt, params)
        return clock() - start

    run(2)
    return statistics.median(run(1 + tokens) - run(1) for _ in range(3)) / tokens * 1e3


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default=None, help="a GGUF file (default: the default model)")
    parser.add_argument("--dtype", choices=("float32", "bfloat16"), default="float32")
    parser.add_argument("--context", type=int, default=192, help="keys per attention call")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--passes", type=int, default=7)
    parser.add_argument("--tokens", type=int, default=32, help="decode tokens for the step time")
    parser.add_argument(
        "--clock",
        choices=tuple(CLOCKS),
        default="wall",
        help="process: the process's CPU time (a shared host's other jobs do not count; with "
        "one thread, its work)",
    )
    parser.add_argument(
        "--activation-quantization",
        choices=("int8", "int16"),
        default=None,
        help="int8 / int16: the linears as `--activation-quantization int8 / int16` serves them "
        "(Q8 panels); unset: float activations",
    )
    args = parser.parse_args(argv)
    from bench.host_label import host_label
    from bench.machine_limits import probe_read_gb_s
    from models import cpu_kernels
    from models.default_model import default_model_path
    from models.loader import load_model

    clock = CLOCKS[args.clock]
    if args.threads is not None:
        torch.set_num_threads(args.threads)
    ext = cpu_kernels.extension()
    if ext is None:
        raise SystemExit("tgserve's C++ CPU kernels are unavailable here")
    path = str(args.model or default_model_path())
    model, _ = load_model(path, args.dtype, "cpu")
    if args.activation_quantization is not None:
        from models.activation_quant import quantize_activations

        quantize_activations(model, 16 if args.activation_quantization == "int16" else 8)
    config = model.config
    layers = linear_groups(model)
    gen = torch.Generator().manual_seed(0)
    xs = {
        k: torch.randn(1, k, generator=gen).to(getattr(torch, args.dtype))
        for k in {layer.in_features for _, layer in layers}
    }
    time_pass(ext, layers, xs)  # warm
    passes = [time_pass(ext, layers, xs, clock) for _ in range(args.passes)]
    rows: dict[str, tuple[float, int]] = {}
    for role in ROLES:
        keys = {key for key, _ in layers if key.split()[0] == role}
        ms = statistics.median(sum(p[key] for key in keys) for p in passes) * 1e3
        nbytes = sum(weight_bytes(layer) for key, layer in layers if key in keys)
        rows[role] = (ms, nbytes)
    rows["attention"] = time_attention(ext, config, args.context, args.passes * 5, clock)
    hidden_ms, logits_ms, by_op_ms = time_fused_step(
        model, config, args.context, args.passes * 5, clock
    )
    del model, layers
    gc.collect()
    step_ms = engine_decode_ms(
        path, args.dtype, args.context, args.tokens, clock, args.activation_quantization
    )
    in_step = sum(rows[r][0] for r in ("qkv_proj", "o_proj", "gate_up_proj", "down_proj"))
    rows["elementwise"] = (hidden_ms - in_step - rows["attention"][0], 0)
    rows["engine"] = (step_ms - hidden_ms - logits_ms, 0)
    bound = max(probe_read_gb_s(), default=float("nan"))
    print(
        f"build {cpu_kernels.selected_build()} on {host_label('cpu')}, "
        f"{torch.get_num_threads()} threads, {args.dtype}, "
        f"activations {args.activation_quantization or args.dtype}, context {args.context}, "
        f"{args.clock} "
        "clock; "
        f"read probe {bound:.1f} GB/s; decode step {step_ms:.2f} ms ({1e3 / step_ms:.1f} tok/s), "
        f"C++ step {hidden_ms:.2f} ms + logits {logits_ms:.2f} ms"
    )
    if by_op_ms is not None:  # step_region.h against the op-by-op step, alternating
        print(
            f"C++ step op by op {by_op_ms:.2f} ms: one region / op by op {hidden_ms / by_op_ms:.3f}"
        )
    print(f"{'op':<13}{'ms/token':>9}{'share':>7}{'MB':>7}{'GB/s':>7}{'% bound':>8}")
    for name, (ms, nbytes) in rows.items():
        gb_s = nbytes / ms / 1e6 if nbytes and ms > 0 else float("nan")
        print(
            f"{name:<13}{ms:9.2f}{ms / step_ms:7.1%}{nbytes / 1e6:7.1f}{gb_s:7.1f}"
            f"{gb_s / bound:8.0%}"
        )
    all_bytes = sum(b for _, b in rows.values())
    print(
        f"{'total':<13}{step_ms:9.2f}{1:7.0%}{all_bytes / 1e6:7.1f}"
        f"{all_bytes / step_ms / 1e6:7.1f}{all_bytes / step_ms / 1e6 / bound:8.0%}"
    )


if __name__ == "__main__":
    main()
