"""`tgserve bench serve --sweep concurrency=1,2,4,8` (or `request-rate=0.5,1,2`): the serving
load run once per point, the same seeded workload each time, for a throughput / latency curve.

Contract:
- `parse_sweep(text) -> Sweep` reads `NAME=V1,V2,...` with NAME `concurrency` (integers >= 1)
  or `request-rate` (requests per second > 0, `inf` for all at once); ValueError naming
  `--sweep` on anything else (no values, a repeated value, an unknown name, a bad number).
- `run_sweep(args, sweep, run_point)` calls `run_point(point_args) -> (results, limits)` once
  per value, in the order given, where `point_args` is a copy of `args` with that value set
  (`args` itself is left as it was), and returns all the points' results in that order with
  the first point's machine limits.
  Sweeping concurrency while `--concurrency` is set is a ValueError (which one would hold?);
  a request-rate sweep keeps `--concurrency` as the cap of every point.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

SWEEP_FIELDS = {"concurrency": "concurrency", "request-rate": "request_rate"}


@dataclass(frozen=True)
class Sweep:
    name: str  # "concurrency" or "request-rate", as typed
    values: tuple[float, ...]  # ints for concurrency

    @property
    def attribute(self) -> str:
        """The argparse attribute each point overrides."""
        return SWEEP_FIELDS[self.name]


def parse_sweep(text: str) -> Sweep:
    name, sep, listed = text.partition("=")
    name = name.strip()
    if not sep or name not in SWEEP_FIELDS:
        raise ValueError(f"--sweep takes concurrency=1,2,4 or request-rate=0.5,1,2, got {text!r}")
    items = [item.strip() for item in listed.split(",") if item.strip()]
    if not items:
        raise ValueError(f"--sweep {name}= needs at least one value")
    values = tuple(_value(name, item) for item in items)
    if len(set(values)) != len(values):
        raise ValueError(f"--sweep {name}: a value is repeated in {listed!r}")
    return Sweep(name, values)


def _value(name: str, item: str) -> float:
    try:
        value = int(item) if name == "concurrency" else float(item)
    except ValueError:
        kind = "an integer" if name == "concurrency" else "a number"
        raise ValueError(f"--sweep {name}: {item!r} is not {kind}") from None
    if name == "concurrency" and value < 1:
        raise ValueError(f"--sweep concurrency: values must be >= 1, got {value}")
    if name == "request-rate" and (math.isnan(value) or value <= 0):
        raise ValueError(f"--sweep request-rate: values must be > 0, got {item}")
    return value


def run_sweep(
    args: argparse.Namespace,
    sweep: Sweep,
    run_point: Callable[[argparse.Namespace], tuple[Any, Any]],
) -> tuple[list[Any], Any]:
    if sweep.name == "concurrency" and args.concurrency is not None:
        raise ValueError("--sweep concurrency=... and --concurrency go apart: drop one")
    results, first_limits = [], None
    for index, value in enumerate(sweep.values):
        point_args = argparse.Namespace(**vars(args))
        setattr(point_args, sweep.attribute, value)
        point_results, limits = run_point(point_args)
        results.extend(point_results)
        if index == 0:
            first_limits = limits
    return results, first_limits
