"""Python opcodes the engine's thread executes per decode step against a fake device (issue 38).

    python -m bench.step_opcodes [--rows 64 256] [--steps 20] [--async-scheduling] [--top 0]

For each row count R: the engine of bench/fake_device.py (R greedy requests, every one decoding,
a fake device of 0.5 ms a step) steps `--steps` times under `sys.settrace` with opcode events
on, counting every opcode the engine's thread executes (the device thread's are not traced:
its logits and sampling stand for a device's work). Deterministic up to the step-cost fit's
path (engine/scheduling/step_cost.py learns the measured step times), so the load barely
moves it, unlike a time; what it does not see is the cost of the C calls between opcodes.
Printed per R: opcodes per step and per row, and with `--top N` the N functions that
execute the most.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from types import CodeType, FrameType

from bench.fake_device import decoding_engine


def count(rows: int, steps: int, async_scheduling: bool = False) -> Counter[CodeType]:
    """Opcodes per code object over `steps` decode steps of `rows` requests."""
    engine = decoding_engine(rows, 0.0005, steps, async_scheduling)
    seen: Counter[CodeType] = Counter()

    def opcode(frame: FrameType, event: str, arg: object):
        if event == "opcode":
            seen[frame.f_code] += 1
        return opcode

    def call(frame: FrameType, event: str, arg: object):
        frame.f_trace_opcodes = True
        return opcode

    try:
        sys.settrace(call)
        try:
            for _ in range(steps):
                engine.step()
        finally:
            sys.settrace(None)
    finally:
        engine.close()
    return seen


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--async-scheduling", action="store_true")
    parser.add_argument("--top", type=int, default=0)
    args = parser.parse_args(argv)
    loop = "overlapped" if args.async_scheduling else "synchronous"
    for rows in args.rows:
        seen = count(rows, args.steps, args.async_scheduling)
        per_step = sum(seen.values()) / args.steps
        print(
            f"{rows:4d} rows, {loop}: {per_step:9,.0f} opcodes a step ({per_step / rows:.1f} a row)"
        )
        for code, n in seen.most_common(args.top):
            where = f"{code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}"
            print(f"    {n / args.steps:9,.0f}  {code.co_qualname}  ({where})")


if __name__ == "__main__":
    main()
