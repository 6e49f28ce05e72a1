"""The MoE experts' one OpenMP region against each expert's products in turn, in one process.

`python -m bench.moe_region --model FILE.gguf [--activation-quantization int8] [--threads N]
[--context 192] [--steps 10] [--blocks 5] [--clock process]` loads a mixture-of-experts GGUF as
tgserve serves it (experts as stored; with int8 activations, Q8 panels), builds the C++ step
and times batch-1 decode steps of it (FusedDecoder.hidden, then the LM head: one row at
`context` keys), alternating blocks of `steps` steps between the sparse blocks' one region
(models/cpu_kernels/moe_experts.h) and the per-expert products (`one_region` off on every
block's ext.MoeWeights), so both see the same load on a shared host. Prints ms per step of
each (median over blocks) and their ratio; the two give the same bits (tests/models/moe/
test_moe_cpp_step.py). A diagnostic beside `tgserve bench latency`, which is the figure of
record.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

CLOCKS = {"wall": time.perf_counter, "process": time.process_time}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="a mixture-of-experts GGUF file")
    parser.add_argument("--activation-quantization", choices=("int8",), default=None)
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--context", type=int, default=192, help="keys per attention call")
    parser.add_argument("--steps", type=int, default=10, help="decode steps per block")
    parser.add_argument("--blocks", type=int, default=5, help="blocks per setting")
    parser.add_argument("--clock", choices=tuple(CLOCKS), default="process")
    args = parser.parse_args(argv)
    from bench.host_label import host_label
    from models import allocate_kv_cache
    from models.attention import AttentionMetadata
    from models.cpu_kernels.fused_decoder import FusedDecoder
    from models.loader import load_model

    if args.threads is not None:
        torch.set_num_threads(args.threads)
    model, _ = load_model(args.model, "float32", "cpu")
    if args.activation_quantization == "int8":
        from models.activation_quant import quantize_activations_int8

        quantize_activations_int8(model)
    block = 16
    blocks = -(-args.context // block)
    kv = allocate_kv_cache(model.config, blocks, block, torch.float32, "cpu")
    fused = FusedDecoder.build(model, kv)
    if fused is None or not fused.moe_blocks:
        raise SystemExit("the C++ step does not run this model's sparse blocks")
    if not all(moe.panel_experts for moe in fused.moe_blocks):
        raise SystemExit("these experts do not run through the panel kernels (no one region)")
    meta = AttentionMetadata.build([list(range(blocks))], [args.context], [1], block_size=block)
    ids, positions = torch.tensor([1]), torch.tensor([args.context - 1])
    clock = CLOCKS[args.clock]

    def timed_block(one_region: bool) -> float:
        for moe in fused.moe_blocks:
            moe.one_region = one_region
        fused.logits(fused.hidden(ids, positions, meta))  # warm: this setting's buffers
        start = clock()
        for _ in range(args.steps):
            fused.logits(fused.hidden(ids, positions, meta))
        return (clock() - start) / args.steps * 1e3

    times: dict[bool, list[float]] = {True: [], False: []}
    for _ in range(args.blocks):
        for one_region in (False, True):
            times[one_region].append(timed_block(one_region))
    region, per_expert = statistics.median(times[True]), statistics.median(times[False])
    print(
        f"{args.model}: {host_label('cpu')}, {torch.get_num_threads()} threads, "
        f"{args.activation_quantization or 'float32'} activations, context {args.context}, "
        f"{args.clock} clock, medians of {args.blocks} blocks of {args.steps} steps"
    )
    print(f"per-expert products {per_expert:.3f} ms/step; one region {region:.3f} ms/step; ")
    print(f"one region / per expert: {per_expert / region:.3f}x the speed")


if __name__ == "__main__":
    main()
