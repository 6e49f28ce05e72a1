"""The engine's host time per step against a fake device (issue 38), on any machine.

    python -m bench.fake_device [--device-ms 5] [--rows 64 256] [--steps 40] [--async-scheduling]

For each row count R, R greedy requests (16-token prompts, never stopping before the run ends)
decode on `engine.fake_device_engine` (no model: each step holds a device thread for a fixed
time, engine/fake_device.py). Once every request decodes, `--steps` steps are timed: the step
period (wall clock) and the engine's host time per step: the process's CPU time (scheduling,
handing the step over, updating, outputs) less the device thread's (its logits and the step's
sampling, which run below the runner, on the device: issue 38); CPU time does not grow when
other processes share the cores as wall time does. Printed per R: period, device, host,
max(host, device) (what an overlapped loop can reach), host + device (what a synchronous loop
pays), period / max(host, device), and the device thread's CPU time per step (`dev cpu`).
`--async-scheduling` runs the overlapped loop (EngineConfig.async_scheduling, engine/
step_pipeline.py: step k+1 is scheduled and submitted before step k's tokens reach the host,
and step k's outputs are built while step k+1 runs); without it, the synchronous loop.
"""

from __future__ import annotations

import argparse
import time
from dataclasses import dataclass

from engine import EngineConfig, SamplingParams, device_cpu_seconds, fake_device_engine

PROMPT = list(range(1, 17))


@dataclass(frozen=True)
class Period:
    rows: int
    device_s: float
    host_s: float  # per step: the process's CPU time less the device thread's
    period_s: float  # per step, with the device
    device_cpu_s: float = 0.0  # per step: the device thread's CPU time

    @property
    def bound_s(self) -> float:
        return max(self.host_s, self.device_s)

    def line(self) -> str:
        ms = 1e3
        return (
            f"{self.rows:4d} rows: step period {self.period_s * ms:6.2f} ms | device "
            f"{self.device_s * ms:5.2f} ms | host {self.host_s * ms:5.2f} ms | "
            f"max {self.bound_s * ms:5.2f} ms | sum {(self.host_s + self.device_s) * ms:5.2f} ms"
            f" | period / max {self.period_s / self.bound_s:4.2f}"
            f" | dev cpu {self.device_cpu_s * ms:5.2f} ms"
        )


def decoding_engine(rows: int, device_s: float, steps: int, async_scheduling: bool = False):
    """A fresh fake-device engine whose `rows` greedy requests all decode, with `steps` more
    steps before any ends (bench/step_opcodes.py counts on it too)."""
    config = EngineConfig(
        block_size=16,
        max_num_seqs=rows,
        max_num_batched_tokens=max(2048, rows * len(PROMPT)),
        max_model_len=len(PROMPT) + steps + 64,
        enable_prefix_caching=False,
        async_scheduling=async_scheduling,
    )
    engine = fake_device_engine(device_s, config)
    params = SamplingParams(max_tokens=steps + 32, temperature=0.0, ignore_eos=True)
    try:
        for i in range(rows):
            engine.add_request(str(i), PROMPT, params)
        while engine.stats().num_waiting or engine.stats().num_running < rows:
            engine.step()
        for _ in range(3):  # every request past its first token
            engine.step()
    except BaseException:
        engine.close()
        raise
    return engine


def measure(rows: int, device_s: float, steps: int, async_scheduling: bool = False) -> Period:
    """`steps` decode steps of `rows` requests on a fresh engine."""
    engine = decoding_engine(rows, device_s, steps, async_scheduling)
    try:
        start, cpu, device_cpu = (
            time.perf_counter(),
            time.process_time(),
            device_cpu_seconds(engine),
        )
        for _ in range(steps):
            engine.step()
        device_cpu = (device_cpu_seconds(engine) - device_cpu) / steps
        host = (time.process_time() - cpu) / steps - device_cpu
        return Period(rows, device_s, host, (time.perf_counter() - start) / steps, device_cpu)
    finally:
        engine.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device-ms", type=float, default=5.0)
    parser.add_argument("--rows", type=int, nargs="+", default=[64, 256])
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--async-scheduling", action="store_true")
    args = parser.parse_args(argv)
    for rows in args.rows:
        period = measure(rows, args.device_ms / 1e3, args.steps, args.async_scheduling)
        print(period.line(), flush=True)


if __name__ == "__main__":
    main()
