"""The verdict and report of `tgserve bench soak`: latency per time window, resource trends, leaks.

Contract: `judge(run, limits) -> SoakReport`; the soak FAILS (`report.passed` False, the command
exits 1) when any of these holds, each named in `report.failures`:
- any 5xx answer, or any request that failed for another reason than leaving on purpose
  (transport error, an error event, a stream without `[DONE]`; a 429 is reported, not failed);
- RSS grows: the least-squares slope of RSS over the second half of the load phase is above
  `limits.max_rss_slope_mb_per_min`;
- FDs grow: open FDs once idle after the load exceed those before it by more than
  `limits.max_fd_growth` (idle-to-idle, so connections in flight do not count);
- the server is not idle after the drain: running or waiting above 0, or KV blocks used above
  their value before the load;
- no RSS / FD sample could be read at all (no `process_*` metrics and no `--pid`).
Windows of `window_s` seconds (by finish time) report requests, p50 / p99 TTFT and end-to-end
latency of the completed ones, and the last RSS / FD / running + waiting sample in the window
(a `busy` count that keeps rising means the rate is above capacity: a backlog, not a steady
state; RSS then grows as KV-cache pages are first touched, which is not a leak). `render(report)` is a
text table; `as_json(report)` a JSON-ready dict.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

from bench.serve_metrics import percentile
from bench.soak import Sample, SoakRun

MB = 1024 * 1024


@dataclass(frozen=True)
class Limits:
    max_rss_slope_mb_per_min: float = 8.0
    max_fd_growth: int = 8
    window_s: float = 60.0


@dataclass(frozen=True)
class Window:
    start_s: float
    requests: int
    completed: int
    left: int
    failed: int
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    e2e_p50_ms: float | None
    e2e_p99_ms: float | None
    rss_mb: float | None
    open_fds: float | None
    in_server: float | None  # running + waiting at the window's last sample: steady or backlog


@dataclass
class SoakReport:
    requests: int
    completed: int
    left: int
    skipped: int
    status_5xx: int
    status_429: int
    other_failures: int
    rss_start_mb: float | None
    rss_end_mb: float | None
    rss_slope_mb_per_min: float | None
    fds_before: float | None
    fds_after: float | None
    e2e_p99_ms: float | None
    ttft_p99_ms: float | None
    windows: list[Window]
    failures: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)  # the first few distinct request errors

    @property
    def passed(self) -> bool:
        return not self.failures


def slope_per_min(points: list[tuple[float, float]]) -> float | None:
    """Least-squares slope of (seconds, value) points, in value per minute; None under 3 points."""
    if len(points) < 3:
        return None
    n = len(points)
    mean_t = sum(t for t, _ in points) / n
    mean_v = sum(v for _, v in points) / n
    var = sum((t - mean_t) ** 2 for t, _ in points)
    if var == 0:
        return None
    cov = sum((t - mean_t) * (v - mean_v) for t, v in points)
    return cov / var * 60.0


def _p(values: list[float], q: float) -> float | None:
    return percentile(values, q) * 1000 if values else None


def _last(samples: list[Sample], name: str) -> float | None:
    values = [getattr(s, name) for s in samples if getattr(s, name) is not None]
    return values[-1] if values else None


def judge(run: SoakRun, limits: Limits) -> SoakReport:
    outcomes, samples = run.outcomes, run.samples
    done = [o for o in outcomes if o.ok and not o.left]
    s5xx = sum(1 for o in outcomes if o.status is not None and o.status >= 500)
    s429 = sum(1 for o in outcomes if o.status == 429)
    other = [o for o in outcomes if o.error is not None and not (o.status or 0) >= 500]
    load = [s for s in samples if s.phase == "load" and s.rss_bytes is not None]
    half = [(s.t_s, s.rss_bytes / MB) for s in load if s.t_s >= run.load_s / 2]
    before = [s for s in samples if s.phase == "before"]
    drained = [s for s in samples if s.phase == "drain"]
    report = SoakReport(
        requests=len(outcomes),
        completed=len(done),
        left=sum(1 for o in outcomes if o.left),
        skipped=run.skipped,
        status_5xx=s5xx,
        status_429=s429,
        other_failures=len(other),
        rss_start_mb=load[0].rss_bytes / MB if load else None,
        rss_end_mb=load[-1].rss_bytes / MB if load else None,
        rss_slope_mb_per_min=slope_per_min(half),
        fds_before=_last(before, "open_fds"),
        fds_after=_last(drained, "open_fds"),
        e2e_p99_ms=_p([o.e2e_s for o in done], 99),
        ttft_p99_ms=_p([o.ttft_s for o in done if o.ttft_s is not None], 99),
        windows=_windows(run, limits.window_s),
        errors=list(dict.fromkeys(o.error for o in other if o.error))[:5],
    )
    report.failures = _failures(report, limits, before, drained)
    return report


def _failures(
    r: SoakReport, limits: Limits, before: list[Sample], drained: list[Sample]
) -> list[str]:
    failures = []
    if r.status_5xx:
        failures.append(f"{r.status_5xx} responses were 5xx")
    if r.other_failures:
        failures.append(f"{r.other_failures} requests failed: {'; '.join(r.errors)}")
    if r.rss_slope_mb_per_min is None or r.fds_before is None or r.fds_after is None:
        failures.append("no RSS / FD samples: the server exports no process_* metrics; give --pid")
    else:
        if r.rss_slope_mb_per_min > limits.max_rss_slope_mb_per_min:
            failures.append(
                f"RSS grows {r.rss_slope_mb_per_min:.2f} MB/min over the second half "
                f"(limit {limits.max_rss_slope_mb_per_min})"
            )
        if r.fds_after - r.fds_before > limits.max_fd_growth:
            failures.append(
                f"open FDs grew from {r.fds_before:.0f} to {r.fds_after:.0f} once idle "
                f"(limit +{limits.max_fd_growth})"
            )
    last = drained[-1] if drained else None
    if last is not None and (last.running or last.waiting):
        failures.append(f"not idle after the drain: {last.running} running, {last.waiting} waiting")
    kv_before = _last(before, "kv_blocks_used")
    if last is not None and kv_before is not None and (last.kv_blocks_used or 0) > kv_before:
        failures.append(f"KV blocks used {last.kv_blocks_used:.0f} after, {kv_before:.0f} before")
    return failures


def _windows(run: SoakRun, window_s: float) -> list[Window]:
    windows = []
    count = max(1, math.ceil(run.spec.duration_s / window_s - 1e-9))  # stragglers: the last
    for k in range(count):
        lo, hi = k * window_s, (k + 1) * window_s
        last_window = k == count - 1
        mine = [o for o in run.outcomes if lo <= o.end_s < hi or (last_window and o.end_s >= hi)]
        done = [o for o in mine if o.ok and not o.left]
        in_window = [s for s in run.samples if lo <= s.t_s < hi and s.phase == "load"]
        rss = _last(in_window, "rss_bytes")
        windows.append(
            Window(
                start_s=lo,
                requests=len(mine),
                completed=len(done),
                left=sum(1 for o in mine if o.left),
                failed=sum(1 for o in mine if not o.ok),
                ttft_p50_ms=_p([o.ttft_s for o in done if o.ttft_s is not None], 50),
                ttft_p99_ms=_p([o.ttft_s for o in done if o.ttft_s is not None], 99),
                e2e_p50_ms=_p([o.e2e_s for o in done], 50),
                e2e_p99_ms=_p([o.e2e_s for o in done], 99),
                rss_mb=rss / MB if rss is not None else None,
                open_fds=_last(in_window, "open_fds"),
                in_server=_in_server(in_window),
            )
        )
    return windows


def _in_server(samples: list[Sample]) -> float | None:
    busy = [s for s in samples if s.running is not None and s.waiting is not None]
    return busy[-1].running + busy[-1].waiting if busy else None


def _fmt(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def render(report: SoakReport) -> str:
    head = (
        "window_s  reqs  done  left  fail  ttft_p50  ttft_p99  e2e_p50  e2e_p99  rss_mb   fds  busy"
    )
    lines = [head]
    for w in report.windows:
        lines.append(
            f"{w.start_s:8.0f}  {w.requests:4d}  {w.completed:4d}  {w.left:4d}  {w.failed:4d}  "
            f"{_fmt(w.ttft_p50_ms):>8}  {_fmt(w.ttft_p99_ms):>8}  {_fmt(w.e2e_p50_ms):>7}  "
            f"{_fmt(w.e2e_p99_ms):>7}  {_fmt(w.rss_mb):>6}  {_fmt(w.open_fds, 0):>4}  {_fmt(w.in_server, 0):>4}"
        )
    r = report
    lines += [
        f"requests {r.requests} (completed {r.completed}, left on purpose {r.left}, "
        f"skipped at the in-flight cap {r.skipped}); 5xx {r.status_5xx}, 429 {r.status_429}, "
        f"other failures {r.other_failures}",
        f"RSS {_fmt(r.rss_start_mb)} -> {_fmt(r.rss_end_mb)} MB, second-half slope "
        f"{_fmt(r.rss_slope_mb_per_min, 2)} MB/min; open FDs idle {_fmt(r.fds_before, 0)} -> "
        f"{_fmt(r.fds_after, 0)}; p99 TTFT {_fmt(r.ttft_p99_ms)} ms, p99 e2e {_fmt(r.e2e_p99_ms)} ms",
        "PASS" if r.passed else "FAIL: " + "; ".join(r.failures),
    ]
    return "\n".join(lines)


def as_json(report: SoakReport) -> dict[str, Any]:
    return {"kind": "soak", "passed": report.passed, **asdict(report)}
