"""The GPU check's figures, read back from its stages' output, and issue 24's targets beside them.

Contract (standard library only): `json_lines(text)` keeps the JSON objects a stage printed one
per line; `collect(results)` returns a dict of what the stages measured (None where a stage
did not run or printed nothing usable): the environment, the machine limits, batch-1 decode and
prefill with their fractions of the bounds (and again under --batch-invariant), the offline
runs (tgserve, transformers, ratio), serving ITL p99/p50 (at the default step-time target and
at a tight one), the suite's counts and failing tests, the profile. `targets(figures)` lists
each target with the measured value and whether it is met (None when not measured). Figures
are copied, never recomputed: the benchmarks' own JSON is the record.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from typing import Any

from bench.gpu_check.runner import StageResult

TODAY_WIDE_TOK_S = 3334.0  # 256 x 512/256 at --max-num-seqs 256 on an H200 before issue 24
SUITE_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|error|errors|xfailed|xpassed)\b")
# `pytest -v` per-test lines, with xdist ("[gw3] [ 12%] PASSED tests/x.py::t") or without
# ("tests/x.py::t PASSED [ 12%]")
OUTCOMES = "PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS"
XDIST_LINE = re.compile(rf"\b({OUTCOMES}) (tests/\S+)")
PLAIN_LINE = re.compile(rf"^(tests/\S+) ({OUTCOMES})\b")


def json_lines(text: str) -> list[dict[str, Any]]:
    out = []
    for line in text.splitlines():
        if line.startswith("{"):
            try:
                out.append(json.loads(line))
            except json.JSONDecodeError:
                continue
    return out


def _of_kind(result: StageResult | None, kind: str) -> list[dict[str, Any]]:
    if result is None:
        return []
    return [x for x in json_lines(result.stdout) if x.get("kind") == kind]


def collect(results: Sequence[StageResult]) -> dict[str, Any]:
    by_name = {r.name: r for r in results}
    env = _of_kind(by_name.get("environment"), "environment")
    machine = _of_kind(by_name.get("latency"), "machine") or _of_kind(
        by_name.get("offline"), "machine"
    )
    latency = _of_kind(by_name.get("latency"), "latency")
    invariant = _of_kind(by_name.get("latency_invariant"), "latency")
    fp8 = _of_kind(by_name.get("latency_fp8"), "latency")
    offline = _of_kind(by_name.get("offline"), "throughput")
    wide = _of_kind(by_name.get("offline_wide"), "throughput")
    serve = _of_kind(by_name.get("serve"), "serve")
    serve_itl = _of_kind(by_name.get("serve_itl"), "serve")
    profile = _of_kind(by_name.get("profile"), "profile")
    return {
        "environment": env[0] if env else None,
        "machine": machine[0] if machine else None,
        "latency": latency[0] if latency else None,
        "latency_invariant": invariant[0] if invariant else None,
        "latency_fp8": fp8[0] if fp8 else None,
        "offline": {r["backend"]: r for r in offline} or None,
        "offline_wide": wide[0] if wide else None,
        "serve": serve[0] if serve else None,
        "serve_itl": serve_itl[0] if serve_itl else None,
        "suite": suite_summary(by_name.get("suite")),
        "profile": profile[0] if profile else None,
    }


def suite_summary(result: StageResult | None) -> dict[str, Any] | None:
    """pytest's final counts; when it was cut off before printing them, the counts of its
    verbose per-test lines so far (`summary` then says so)."""
    if result is None or result.status == "skipped":
        return None
    counts: dict[str, int] = {}
    lines = result.stdout.splitlines()
    summary = next((ln for ln in reversed(lines) if SUITE_COUNTS.search(ln) and " in " in ln), "")
    for number, word in SUITE_COUNTS.findall(summary):
        counts["errors" if word.startswith("error") else word] = int(number)
    failing = [ln.split(" - ")[0] for ln in lines if ln.startswith(("FAILED ", "ERROR "))]
    if not summary:
        for line in lines:
            found = XDIST_LINE.search(line)
            plain = PLAIN_LINE.search(line)
            outcome, test = (
                found.groups() if found else (plain.groups()[::-1] if plain else (None, None))
            )
            if outcome is None:
                continue
            key = {"error": "errors", "xfail": "xfailed", "xpass": "xpassed"}.get(
                outcome.lower(), outcome.lower()
            )
            counts[key] = counts.get(key, 0) + 1
            if outcome in ("FAILED", "ERROR"):
                failing.append(f"{outcome} {test}")
        summary = f"cut off before pytest's summary; per-test lines so far: {counts}"
    return {"counts": counts, "summary": summary.strip("= "), "failing": failing}


def targets(figures: dict[str, Any]) -> list[dict[str, Any]]:
    lat, offline, wide, serve = (
        figures[k] for k in ("latency", "offline", "offline_wide", "serve")
    )
    suite = figures["suite"]
    ratio = None
    if offline and "transformers" in offline and "tgserve" in offline:
        ratio = offline["tgserve"]["output_tok_s"] / offline["transformers"]["output_tok_s"]
    failed = None
    if suite and suite["counts"]:
        failed = suite["counts"].get("failed", 0) + suite["counts"].get("errors", 0)
    rows = [
        ("CUDA suite: failed + errors", "0", "count", failed, lambda v: v == 0),
        (
            "batch-1 decode, fraction of the HBM bound",
            ">= 80%",
            "fraction",
            lat and lat.get("decode_fraction_of_bound"),
            lambda v: v >= 0.8,
        ),
        ("offline 64 x 512/256 vs transformers", ">= 8x", "ratio", ratio, lambda v: v >= 8.0),
        (
            "offline 256 x 512/256, output tok/s",
            f">= {3 * TODAY_WIDE_TOK_S:.0f} (3x {TODAY_WIDE_TOK_S:.0f})",
            "rate",
            wide and wide.get("output_tok_s"),
            lambda v: v >= 3 * TODAY_WIDE_TOK_S,
        ),
        (
            "512-token prefill, fraction of the matmul rate",
            ">= 60%",
            "fraction",
            lat and lat.get("prefill_fraction_of_bound"),
            lambda v: v >= 0.6,
        ),
        (
            "serving 64 streams, ITL p99/p50",
            "<= 1.5",
            "ratio",
            serve and serve.get("itl_p99_over_p50"),
            lambda v: v <= 1.5,
        ),
    ]
    return [
        {
            "what": what,
            "target": target,
            "unit": unit,
            "measured": value,
            "met": None if value is None else bool(met(value)),
        }
        for what, target, unit, value, met in rows
    ]
