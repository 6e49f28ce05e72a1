"""`tgserve bench soak|burst|short-behind-long`: probes of a running server that print their own
reports, once bench/cli.py parsed the arguments (bench/commands.py dispatches here).

Contract: `run_soak_command(args) -> int` runs a soak against `--url` (soak.py), prints its report
(soak_report.py; JSON with `--json`) and returns 1 when the soak failed its limits (RSS slope, fd
growth), else 0; a server that does not answer at `--url` raises. `run_probe_command(args) -> int`
runs `bench burst` (burst.py: a burst of requests against the server's admission) or `bench
short-behind-long` (short_behind_long.py: a short request's latency behind long prompts), prints
the probe's table between the load averages before and after, and returns 0.
"""

from __future__ import annotations

import argparse
import os
import sys

from bench.serve_load import discover_model


def run_soak_command(args: argparse.Namespace) -> int:
    import json

    from bench.soak import SoakSpec, run_soak
    from bench.soak_report import Limits, as_json, judge, render

    spec = SoakSpec(
        url=args.url.rstrip("/"),
        duration_s=args.duration,
        request_rate=args.request_rate,
        disconnect_fraction=args.disconnect_fraction,
        prompt_len=args.prompt_len,
        max_tokens=args.max_tokens,
        vocab_size=args.vocab_size,
        max_in_flight=args.max_in_flight,
        timeout_s=args.timeout,
        sample_interval_s=args.sample_interval,
        drain_s=args.drain,
        seed=args.seed,
        pid=args.pid,
        model=args.model,
        api_key=args.api_key,
    )
    limits = Limits(args.max_rss_slope, args.max_fd_growth, args.window)
    discover_model(spec.url, spec.api_key)  # a clear error when nothing answers at --url
    report = judge(run_soak(spec), limits)
    print(json.dumps(as_json(report)) if args.json else render(report))
    return 0 if report.passed else 1


def run_probe_command(args: argparse.Namespace) -> int:
    print(f"load average before: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    url = args.url.rstrip("/")
    if args.bench_command == "burst":
        from bench import burst

        spec = burst.BurstSpec(
            url,
            args.num_requests,
            args.in_flight,
            args.prompt_len,
            args.max_tokens,
            args.runs,
            args.seed,
            args.model,
        )
        print(burst.render(spec, burst.run_burst(spec)))
    else:
        from bench import short_behind_long as probe

        pspec = probe.ProbeSpec(
            url,
            args.num_long,
            args.long_len,
            args.short_len,
            args.delay,
            args.runs,
            args.seed,
            args.model,
            {"both": (True, False), "true": (True,), "false": (False,)}[args.long_stream],
        )
        print(probe.render(pspec, *probe.run_probe(pspec)))
    print(f"load average after: {os.getloadavg()[0]:.2f}", file=sys.stderr)
    return 0
