"""The GPU check's report: one markdown file for people, one JSON file for tools.

Contract (standard library only): `write_report(out_dir, meta, results, figures, rows)` writes
`report.md` and `report.json` into `out_dir` and returns their paths; `render_summary` is the
stages' statuses and the targets in a few lines, printed last. The markdown always has
every section of `SECTIONS`, in order; a section whose stage did not run says why instead of
figures, so a reader sees at once what was measured and what was not. The JSON holds `meta`,
every stage (command, status, seconds, limit, the output's tail), the figures and the targets.
A `--tiny` run says in its title that its figures are a CPU dry run, not measurements to quote.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

from bench.gpu_check.runner import StageResult

SECTIONS = (
    "Environment",
    "Stages",
    "Machine limits",
    "Benchmarks",
    "Targets",
    "Test suite",
    "Profile",
)


def write_report(
    out_dir: Path,
    meta: dict[str, Any],
    results: Sequence[StageResult],
    figures: dict[str, Any],
    rows: list[dict[str, Any]],
) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    stages = [{k: v for k, v in asdict(r).items() if k != "stdout"} for r in results]
    data = {"meta": meta, "stages": stages, "figures": figures, "targets": rows}
    json_path = out_dir / "report.json"
    json_path.write_text(json.dumps(data, indent=1, default=str) + "\n")
    md_path = out_dir / "report.md"
    md_path.write_text(render(meta, results, figures, rows))
    return md_path, json_path


def render(
    meta: dict[str, Any],
    results: Sequence[StageResult],
    figures: dict[str, Any],
    rows: list[dict[str, Any]],
) -> str:
    kind = "CPU dry run (--tiny): no figure here is a measurement to quote" if meta["tiny"] else ""
    head = f"# tgserve GPU check{': ' + kind if kind else ''}\n\n"
    head += f"{meta['started']}, commit {meta['commit']}, {meta['elapsed_s']:.0f} s "
    head += f"of a {meta['budget_s']:.0f} s budget, device `{meta['device']}`\n"
    bodies = {
        "Environment": _environment(figures["environment"]),
        "Stages": _stages(results),
        "Machine limits": _machine(figures["machine"]),
        "Benchmarks": _benchmarks(figures),
        "Targets": _targets(rows),
        "Test suite": _suite(figures["suite"]),
        "Profile": _profile(figures["profile"]),
    }
    return head + "".join(f"\n## {name}\n\n{bodies[name]}\n" for name in SECTIONS)


def render_summary(results: Sequence[StageResult], rows: list[dict[str, Any]]) -> str:
    """A few lines to print last (a remote run's output is often read from its tail)."""
    stages = ", ".join(f"{r.name} {r.status} {r.seconds:.0f}s" for r in results)
    return f"Summary: {stages}\n\n{_targets(rows)}\n"


def _fmt(value: Any, digits: int = 1) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:,.{digits}f}"
    return str(value)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{100 * value:.0f}%"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> str:
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return "\n".join(lines)


def _missing(what: str) -> str:
    return f"Not measured: {what} (see Stages)."


def _environment(env: dict[str, Any] | None) -> str:
    if env is None:
        return _missing("the environment stage printed nothing")
    return _table(["", ""], [[k, _fmt(v)] for k, v in env.items() if k != "kind"])


def _stages(results: Sequence[StageResult]) -> str:
    rows = [
        [r.name, r.status, f"{r.seconds:.0f} / {r.limit_s:.0f}", f"`{r.command}`" + _why(r)]
        for r in results
    ]
    text = _table(["stage", "status", "s / limit", "command"], rows)
    for r in results:
        if r.status in ("failed", "timeout") and r.tail:
            text += f"\n\n{r.name} ({r.status}), last lines:\n\n```\n{r.tail}\n```"
    return text


def _why(r: StageResult) -> str:
    return f" ({r.reason})" if r.reason else ""


def _machine(m: dict[str, Any] | None) -> str:
    if m is None:
        return _missing("no limits line from the latency or offline stage")
    rates = ", ".join(f"M={r['m']}: {r['gflops'] / 1e3:,.1f}" for r in m["matmul"])
    peak = m.get("peak_matmul_gflops")
    return (
        f"{m.get('device_name') or m.get('device', 'cpu')}: memory bandwidth "
        f"{m['bandwidth_gb_s']:,.0f} GB/s (copy {m['bandwidth_copy_gb_s']:,.0f} counting read + "
        f"write, sum {m['bandwidth_read_gb_s']:,.0f} reading); {m['dtype']} matmul TFLOP/s: "
        f"peak {_fmt(peak and peak / 1e3)}, the model's shapes {rates}."
    )


def _benchmarks(f: dict[str, Any]) -> str:
    rows = []
    lat = f["latency"]
    if lat:
        note = f"{lat['input_len']} in / {lat['output_len']} out, median of {lat['runs']}"
        for phase in ("decode", "prefill"):
            label = "batch-1 decode tok/s" if phase == "decode" else "prefill tok/s"
            figures = (lat[f"{phase}_tok_s"], lat[f"{phase}_bound_tok_s"])
            rows.append([label, *map(_fmt, figures), _pct(lat[f"{phase}_fraction_of_bound"]), note])
    for key, flag, what in (
        ("latency_invariant", "--batch-invariant", "batch-invariant"),
        ("latency_fp8", "--kv-cache-dtype fp8", "fp8 K/V"),
    ):
        inv = f.get(key)
        if not inv:
            continue
        note = flag + (
            f"; x{inv['decode_tok_s'] / lat['decode_tok_s']:.2f} / "
            f"x{inv['prefill_tok_s'] / lat['prefill_tok_s']:.2f} of the default"
            if lat
            else ""
        )
        for phase in ("decode", "prefill"):
            label = f"batch-1 {phase} tok/s, {what}"
            rows.append([label, _fmt(inv[f"{phase}_tok_s"]), "-", "-", note])
    for backend, r in (f["offline"] or {}).items():
        what = f"offline {r['num_requests']} requests, {backend}, output tok/s"
        rows.append(
            [
                what,
                _fmt(r["output_tok_s"]),
                "-",
                _pct(r["fraction_of_bound"]),
                f"x{r['output_ratio_vs_first']:.2f} of tgserve",
            ]
        )
    wide = f["offline_wide"]
    if wide:
        what = f"offline {wide['num_requests']} requests, output tok/s"
        rows.append([what, _fmt(wide["output_tok_s"]), "-", "-", wide["note"][:80]])
    for key, how in (("serve", ""), ("serve_itl", ", tight step-time target")):
        serve = f.get(key)
        if serve:
            rows.append(_serve_row(serve, how))
    if not rows:
        return _missing("no benchmark stage printed a result")
    return _table(["what", "measured", "bound", "of bound", "note"], rows)


def _serve_row(serve: dict[str, Any], how: str) -> list[str]:
    itl, ttft = serve["itl"], serve["ttft"]
    note = (
        f"ITL p50 {_fmt(itl['p50_ms'], 2)} ms, p99 {_fmt(itl['p99_ms'], 2)} ms; TTFT p50 "
        f"{_fmt(ttft['p50_ms'])} ms; {_fmt(serve['output_tok_s'])} output tok/s; "
        f"{serve['failed']} failed"
    )
    what = f"serve {serve['num_requests']} streams{how}, ITL p99/p50"
    return [what, _fmt(serve["itl_p99_over_p50"], 2), "-", "-", note]


def _targets(rows: list[dict[str, Any]]) -> str:
    def shown(v: Any, unit: str) -> str:
        if v is None or unit == "count":
            return _fmt(v)
        return {"fraction": _pct(v), "ratio": f"{v:.2f}x", "rate": f"{v:,.0f}"}[unit]

    def met(v: bool | None) -> str:
        return "not measured" if v is None else ("met" if v else "missed")

    return _table(
        ["target", "wanted", "measured", ""],
        [[r["what"], r["target"], shown(r["measured"], r["unit"]), met(r["met"])] for r in rows],
    )


def _suite(suite: dict[str, Any] | None) -> str:
    if suite is None:
        return _missing("the suite stage did not run")
    text = suite["summary"] or "no pytest summary line (the stage was cut off or crashed)"
    if suite["failing"]:
        text += "\n\n" + "\n".join(f"- `{name}`" for name in suite["failing"][:60])
    return text


def _profile(p: dict[str, Any] | None) -> str:
    if p is None:
        return _missing("the profile stage printed nothing")
    parts = [f"{p['note']}"]
    steps = [(f"decode, batch {b['batch']}" + _context(b), b) for b in p["batches"]]
    if p.get("prefill"):
        steps.append((f"prefill of a {p['prefill']['tokens']}-token prompt, alone", p["prefill"]))
    for title, b in steps:
        parts.append(
            f"{title}: {b['wall_ms_per_step']:.2f} ms wall per step, device kernels "
            f"{_fmt(b['device_kernel_ms_per_step'], 2)} ms ({_pct(b['device_busy_fraction'])} "
            f"busy), profiled CPU {b['profiled_cpu_ms_per_step']:.2f} ms, "
            f"{_fmt(b['kernel_launches_per_step'], 0)} launches per step"
        )
        top = [
            [t["name"], f"{t['ms_per_step']:.3f}", f"{t['calls_per_step']:.1f}"] for t in b["top"]
        ]
        parts.append(_table(["top by self time", "ms / step", "calls / step"], top))
    return "\n\n".join(parts)


def _context(batch: dict[str, Any]) -> str:
    return f" at a {batch['context']}-token context" if batch.get("context") else ""
