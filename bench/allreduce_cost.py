"""What tensor parallel's collectives cost per step on this machine, apart from the model.

`python -m bench.allreduce_cost [--hidden 576] [--layers 30] [--rows 1] [--dtype bfloat16]
[--world 2] [--iters 500]` spawns `world` gloo ranks on loopback (one thread each, as
tgserve's ranks run) and times, on rank 0, the collectives of one decode step of a
Llama-family model at TP=world: 2 all-reduces of [rows, hidden] per layer (o and down
projections), 1 for the vocabulary-parallel embedding, plus the step's broadcast of packed
inputs (~64 int64). Prints one JSON line: microseconds per all-reduce and per step's
collectives (medians over `iters` steps), and the bytes one rank sends per step (a ring
all-reduce sends 2 (world - 1) / world of the tensor). Defaults: SmolLM2-135M's shapes.

Across hosts: `--rank R --master-addr A --master-port P` runs rank R alone (start one per
host, rank 0 at A); rank 0 prints the line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from models.parallel import free_port, init_group


def _rank(rank: int, args: argparse.Namespace, port: int, out) -> None:
    torch.set_num_threads(1)
    group = init_group(rank, args.world, port, torch.device("cpu"), master_addr=args.master_addr)
    x = torch.randn(args.rows, args.hidden).to(getattr(torch, args.dtype))
    packet = torch.zeros(64, dtype=torch.int64)
    per_reduce, per_step = [], []
    for i in range(args.iters + 20):
        dist.barrier()
        t0 = time.perf_counter()
        group.broadcast(packet)
        for _ in range(2 * args.layers + 1):
            t1 = time.perf_counter()
            group.all_reduce(x)
            per_reduce.append(time.perf_counter() - t1)
        if i >= 20:  # warm-up steps are dropped
            per_step.append(time.perf_counter() - t0)
    if rank == 0:
        out.put(
            {
                "world": args.world,
                "dtype": args.dtype,
                "shape": [args.rows, args.hidden],
                "collectives_per_step": 2 * args.layers + 2,
                "all_reduce_us_p50": 1e6 * statistics.median(per_reduce),
                "step_collectives_us_p50": 1e6 * statistics.median(per_step),
                "sent_bytes_per_step": sent_per_step(args, x.element_size()),
            }
        )
    group.close()


def sent_per_step(args: argparse.Namespace, element_bytes: int) -> int:
    reduce = args.rows * args.hidden * element_bytes * 2 * (args.world - 1) // args.world
    return (2 * args.layers + 1) * reduce + 64 * 8  # the broadcast: rank 0 sends its packet


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.allreduce_cost")
    parser.add_argument("--hidden", type=int, default=576)
    parser.add_argument("--layers", type=int, default=30)
    parser.add_argument("--rows", type=int, default=1)
    parser.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"])
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--iters", type=int, default=500)
    parser.add_argument("--rank", type=int, default=None, help="run this rank alone")
    parser.add_argument("--master-addr", default="127.0.0.1")
    parser.add_argument("--master-port", type=int, default=None)
    args = parser.parse_args()
    if args.rank is not None:  # one rank of a group over hosts
        out = _Print()
        _rank(args.rank, args, args.master_port, out)
        return
    ctx = mp.get_context("spawn")
    out = ctx.SimpleQueue()
    port = free_port()
    procs = [ctx.Process(target=_rank, args=(r, args, port, out)) for r in range(args.world)]
    for p in procs:
        p.start()
    print(json.dumps(out.get()))
    for p in procs:
        p.join()


class _Print:
    def put(self, line: dict) -> None:
        print(json.dumps(line))


if __name__ == "__main__":
    main()
