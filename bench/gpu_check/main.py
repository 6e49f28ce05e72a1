"""`tgserve bench gpu-check` / `python -m bench.gpu_check`: the arguments and the whole run.

Contract (standard library only, so it starts on an image that lacks the serving packages):
`add_arguments(parser)` declares the flags; `run(args) -> int` builds the plan (plan.py), runs
it inside `--budget` seconds (runner.py), writes `report.md`, `report.json` and `logs.txt` (every
stage's whole output) into `--out` (default: $OUT, else ./gpu-check-out), prints the markdown
and then a short summary (stage statuses, targets), and returns 0 whether or not stages failed
(the report says which); 2 for bad arguments.
`--device` defaults to cuda; `--tiny` runs every stage on `random:tiny-llama` on the CPU (the
CI dry run). `--wheels DIR` installs the wheels there first (default: .whl when it holds any).
`--stages a,b` runs only those (a rerun of what a cut-off run missed).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import subprocess
import time
from pathlib import Path

from bench.gpu_check.findings import collect, targets
from bench.gpu_check.plan import GPU_SUITE, TINY_SUITE, Settings, build_plan
from bench.gpu_check.report import render_summary, write_report
from bench.gpu_check.runner import run_stages, with_site

DEFAULT_BUDGET_S = 465.0  # 8 minutes less a margin for the start and the report
TINY_BUDGET_S = 300.0  # a loaded 2-core CI machine; ~1 minute on an idle one
PER_TEST_TIMEOUT_S = 90


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", type=Path, default=None, help="report folder (default: $OUT)")
    p.add_argument("--device", default=None, help="cuda (default) or cpu")
    p.add_argument("--tiny", action="store_true", help="CPU dry run on random:tiny-llama")
    p.add_argument("--budget", type=float, default=None, help="seconds for every stage together")
    p.add_argument("--wheels", type=Path, default=None, help="wheels to install (default: .whl)")
    p.add_argument("--site", type=Path, default=Path("/tmp/tgserve-site"), help="install target")
    p.add_argument(
        "--stages", default=None, help="comma-separated stage names to run (default all)"
    )
    p.add_argument("--workers", type=int, default=None, help="xdist workers for the suite")
    p.add_argument("--suite", nargs=argparse.REMAINDER, default=None, help="pytest arguments")


def run(args: argparse.Namespace) -> int:
    device = args.device or ("cpu" if args.tiny else "cuda")
    out = args.out or Path(os.environ.get("OUT") or "gpu-check-out")
    wheels = args.wheels if args.wheels is not None else Path(".whl")
    has_wheels = wheels.is_dir() and any(wheels.glob("*.whl"))
    suite = tuple(args.suite) if args.suite else (TINY_SUITE if args.tiny else GPU_SUITE)
    if importlib.util.find_spec("pytest_timeout") is not None:
        suite = ("--timeout", str(PER_TEST_TIMEOUT_S), *suite)
    workers = args.workers
    if workers is None:
        xdist = importlib.util.find_spec("xdist") is not None
        workers = min(12, max(1, (os.cpu_count() or 2) * 3 // 4)) if xdist and not args.tiny else 0
    settings = Settings(
        tiny=args.tiny,
        device=device,
        wheels=str(wheels) if has_wheels else None,
        site=str(args.site),
        suite=suite,
        workers=workers,
    )
    plan = build_plan(settings)
    if args.stages:
        wanted = set(args.stages.split(","))
        unknown = wanted - {s.name for s in plan}
        if unknown:
            print(f"--stages: unknown {sorted(unknown)}; stages are {[s.name for s in plan]}")
            return 2
        plan = [s for s in plan if s.name in wanted]
    budget = args.budget or (TINY_BUDGET_S if args.tiny else DEFAULT_BUDGET_S)
    env = with_site(dict(os.environ), str(args.site)) | {"PYTHONUNBUFFERED": "1"}
    env.setdefault("HF_HUB_OFFLINE", "1")
    out.mkdir(parents=True, exist_ok=True)
    started = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())
    t0 = time.monotonic()
    with (out / "logs.txt").open("w") as log:
        results = run_stages(plan, budget, env, log)
    figures = collect(results)
    meta = {
        "started": started,
        "commit": _commit(),
        "tiny": args.tiny,
        "device": device,
        "budget_s": budget,
        "elapsed_s": time.monotonic() - t0,
    }
    rows = targets(figures)
    md, _ = write_report(out, meta, results, figures, rows)
    print(md.read_text())
    print(render_summary(results, rows))
    return 0


def _commit() -> str:
    try:
        out = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10
        )
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return out.stdout.strip() or "unknown (no git checkout)"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_check", description=__doc__)
    add_arguments(parser)
    return run(parser.parse_args(argv))
