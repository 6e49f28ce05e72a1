"""Pictures of benchmark results: pure functions from result records to a matplotlib figure, and
the PNG writer `tgserve bench ... --plot PATH` calls.

Contract:
- `require_matplotlib()` imports matplotlib on its file-only backend (Agg) and returns pyplot;
  without matplotlib it raises ValueError naming the `plot` extra (the CLI prints it, exit 2).
- `sweep_figure(series)`: `series` maps a backend label to its `ServeResult`s, one per sweep
  point. Two panels share the x axis, output tok/s: TTFT (left) and ITL (right) in ms. Each
  backend draws two lines per panel, p50 (solid, label "<backend> p50") and p99 (dashed,
  "<backend> p99"), through its points in sweep order, each point annotated with its
  concurrency ("c=4") or request rate ("4/s"). A percentile a point lacks (no request made a
  second token, so no ITL) is NaN: a gap in the line, not a zero.
- `throughput_figure(results)`: one bar per backend, output tok/s; where the result carries the
  compute bound (bound_s), a black tick over the bar at output tokens / bound_s
  (label "machine bound").
- `latency_figure(results)`: two panels, prefill tok/s and decode tok/s, one bar per backend,
  with the ticks at prefill_bound_tok_s / decode_bound_tok_s where measured.
- `write_png(figure, path)` writes the PNG (parent folders made) and closes the figure.
- `plot_results(results, path, label)` picks the figure by the results' kind (serve results
  are one backend's sweep, named `label`) and writes it.
Bars come in the order of `results`; the figure's title names model, dtype and host.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from bench.latency import LatencyResult
from bench.serve_metrics import Percentiles, ServeResult
from bench.throughput import ThroughputResult

PLOT_EXTRA_HINT = "plots need matplotlib: pip install 'tgserve[plot]' (or pip install matplotlib)"
BOUND_LABEL = "machine bound"


def require_matplotlib() -> Any:
    try:
        import matplotlib
    except ImportError as exc:
        raise ValueError(PLOT_EXTRA_HINT) from exc
    matplotlib.use("Agg")  # files only: no display on a server
    import matplotlib.pyplot as plt

    return plt


def _ms(p: Percentiles, field: str) -> float:
    value = getattr(p, field)
    return math.nan if value is None else value


def point_label(result: ServeResult) -> str:
    if result.request_rate is not None:
        return f"{result.request_rate:g}/s"
    return f"c={result.concurrency}" if result.concurrency is not None else "all"


def sweep_figure(series: Mapping[str, Sequence[ServeResult]]) -> Any:
    if not series or not all(series.values()):
        raise ValueError("a sweep plot needs at least one point per backend")
    plt = require_matplotlib()
    fig, (ttft_ax, itl_ax) = plt.subplots(1, 2, figsize=(11, 4.5), sharex=True)
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    for index, (backend, results) in enumerate(series.items()):
        color = colors[index % len(colors)]
        x = [r.output_tok_s for r in results]
        for ax, metric in ((ttft_ax, "ttft"), (itl_ax, "itl")):
            for field, style in (("p50_ms", "-"), ("p99_ms", "--")):
                y = [_ms(getattr(r, metric), field) for r in results]
                ax.plot(x, y, style, marker="o", color=color, label=f"{backend} {field[:3]}")
            for r, xi in zip(results, x, strict=True):
                ax.annotate(
                    point_label(r),
                    (xi, _ms(getattr(r, metric), "p50_ms")),
                    textcoords="offset points",
                    xytext=(4, -10),
                    fontsize=8,
                    color=color,
                )
    for ax, name in ((ttft_ax, "TTFT"), (itl_ax, "ITL")):
        ax.set_xlabel("output tok/s")
        ax.set_ylabel(f"{name} (ms)")
        ax.set_title(f"{name} p50 / p99 vs throughput")
        ax.grid(True, alpha=0.3)
        ax.margins(x=0.1)  # room for the last point's label
        ax.legend(fontsize=8)
    first = next(iter(series.values()))[0]
    done = max(first.completed, 1)
    fig.suptitle(
        f"bench serve sweep: {first.num_requests} requests per point, "
        f"{first.prompt_tokens // done} prompt + {first.output_tokens // done} output tokens each"
    )
    fig.tight_layout()
    return fig


def _bars(ax, backends: Sequence[str], values: Sequence[float], bounds, unit: str) -> None:
    positions = range(len(backends))
    bars = ax.bar(positions, values, width=0.6, color="C0")
    ax.bar_label(bars, fmt="%.1f", fontsize=8)
    labelled = False
    for x, bound in zip(positions, bounds, strict=True):
        if bound is not None:
            ax.plot(
                [x - 0.35, x + 0.35],
                [bound, bound],
                "k-",
                lw=2,
                label=None if labelled else BOUND_LABEL,
            )
            labelled = True
    ax.set_xticks(list(positions), list(backends))
    ax.set_ylabel(unit)
    ax.grid(True, axis="y", alpha=0.3)
    if labelled:
        ax.legend(fontsize=8)


def _title(result: LatencyResult | ThroughputResult) -> str:
    host = f" on {result.host}" if result.host else ""
    return f"{result.model} {result.dtype}{host}"


def throughput_bound_tok_s(result: ThroughputResult) -> float | None:
    """Output tok/s at the compute bound: the run's output tokens over its minimal matmul time."""
    return result.output_tokens / result.bound_s if result.bound_s else None


def throughput_figure(results: Sequence[ThroughputResult]) -> Any:
    if not results:
        raise ValueError("a throughput plot needs at least one result")
    plt = require_matplotlib()
    fig, ax = plt.subplots(figsize=(max(5.5, 1.6 * len(results) + 2.5), 4.8))
    _bars(
        ax,
        [r.backend for r in results],
        [r.output_tok_s for r in results],
        [throughput_bound_tok_s(r) for r in results],
        "output tok/s",
    )
    first = results[0]
    ax.set_title(
        f"bench throughput: {first.num_requests} requests ({first.dist}),\n"
        f"{first.prompt_tokens} prompt + {first.output_tokens} output tokens in all",
        fontsize=10,
    )
    fig.suptitle(_title(first), fontsize=9)
    fig.tight_layout()
    return fig


def latency_figure(results: Sequence[LatencyResult]) -> Any:
    if not results:
        raise ValueError("a latency plot needs at least one result")
    plt = require_matplotlib()
    fig, (prefill_ax, decode_ax) = plt.subplots(
        1, 2, figsize=(max(7.0, 2.4 * len(results) + 3), 4.5)
    )
    backends = [r.backend for r in results]
    for ax, phase in ((prefill_ax, "prefill"), (decode_ax, "decode")):
        values = [getattr(r, f"{phase}_tok_s") for r in results]
        bounds = [getattr(r, f"{phase}_bound_tok_s") for r in results]
        _bars(ax, backends, values, bounds, f"{phase} tok/s")
    first = results[0]
    prefill_ax.set_title(f"prefill, {first.input_len}-token prompt", fontsize=10)
    decode_ax.set_title(f"decode, batch 1, {first.output_len} tokens", fontsize=10)
    fig.suptitle(f"bench latency: {_title(first)}", fontsize=10)
    fig.tight_layout()
    return fig


def write_png(figure: Any, path: Path) -> Path:
    plt = require_matplotlib()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, format="png", dpi=110)
    plt.close(figure)
    return path


def plot_results(results: Sequence[Any], path: Path, label: str) -> Path:
    kinds = {getattr(r, "kind", None) for r in results}
    if kinds == {"serve"}:
        return write_png(sweep_figure({label: results}), path)
    if kinds == {"throughput"}:
        return write_png(throughput_figure(results), path)
    if kinds == {"latency"}:
        return write_png(latency_figure(results), path)
    raise ValueError(
        f"--plot draws serve, throughput or latency results, not {sorted(map(str, kinds))}"
    )
