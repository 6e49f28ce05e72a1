"""`--plot` and `bench serve --sweep`: the figures drawn from hand-made result records (the records
are the oracle: each line's / bar's values must be theirs), the PNG written, the sweep's argument
parsing and its loop over points with a fake runner."""

from __future__ import annotations

import argparse
import math
from dataclasses import replace

import pytest

from bench.latency import LatencyResult
from bench.serve_metrics import Percentiles, ServeResult
from bench.sweep import parse_sweep, run_sweep
from bench.throughput import ThroughputResult

PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
LOAD = (0.5, 0.5, 0.5)


def _serve(concurrency: int, tok_s: float, ttft: tuple, itl: tuple) -> ServeResult:
    none = Percentiles(None, None, None, None)
    return ServeResult(
        "serve", "http://x", 16, concurrency, None, 16, 0, 2.0, 8.0, tok_s, 3 * tok_s,
        16 * 128, 16 * 64, Percentiles(None, ttft[0], None, ttft[1]), none,
        Percentiles(None, itl[0], None, itl[1]), none, None, 0, None, None, LOAD, LOAD, (),
    )  # fmt: skip


def _throughput(backend: str, tok_s: float, bound_s: float | None) -> ThroughputResult:
    return ThroughputResult(
        "throughput", backend, "m", "float32", 8, "fixed", 1024, 512, 512 / tok_s, 1.0, tok_s,
        3 * tok_s, 1.0, bound_s, None, None, LOAD, LOAD, "",
    )  # fmt: skip


def _latency(backend: str, prefill: float, decode: float, bounds: tuple) -> LatencyResult:
    return LatencyResult(
        "latency", backend, "m", "float32", 128, 64, 3, prefill, decode, (), (), 1.0, 1.0,
        bounds[1], None, bounds[0], None, LOAD, LOAD, "",
    )  # fmt: skip


SWEEPS = {
    "tgserve": [
        _serve(1, 20.0, (100.0, 150.0), (40.0, 60.0)),
        _serve(2, 35.0, (120.0, 200.0), (50.0, 90.0)),
        _serve(4, 50.0, (180.0, 400.0), (70.0, None)),  # no p99: a gap, not a zero
    ],
    "other": [
        _serve(1, 10.0, (90.0, 95.0), (80.0, 85.0)),
        _serve(2, 18.0, (95.0, 99.0), (82.0, 88.0)),
    ],
}


def _lines_by_label(ax) -> dict[str, tuple[list, list]]:
    return {line.get_label(): (list(line.get_xdata()), list(line.get_ydata())) for line in ax.lines}


def _same(got: list, want: list) -> bool:
    return len(got) == len(want) and all(
        (math.isnan(g) and w is None) or g == w for g, w in zip(got, want, strict=True)
    )


# ----- figures (need matplotlib) ---------------------------------------------------------------


def test_sweep_figure_has_p50_and_p99_lines_per_backend_with_the_records_values():
    pytest.importorskip("matplotlib")
    from bench.plots import sweep_figure

    fig = sweep_figure(SWEEPS)
    ttft_ax, itl_ax = fig.axes[:2]
    for ax, metric in ((ttft_ax, "ttft"), (itl_ax, "itl")):
        lines = _lines_by_label(ax)
        assert set(lines) == {f"{b} {p}" for b in SWEEPS for p in ("p50", "p99")}
        for backend, results in SWEEPS.items():
            for field in ("p50_ms", "p99_ms"):
                x, y = lines[f"{backend} {field[:3]}"]
                assert x == [r.output_tok_s for r in results]
                assert _same(y, [getattr(getattr(r, metric), field) for r in results])
    labels = [t.get_text() for t in ttft_ax.texts]
    assert labels == ["c=1", "c=2", "c=4", "c=1", "c=2"]


def test_throughput_bars_per_backend_with_the_bound_where_carried():
    pytest.importorskip("matplotlib")
    from bench.plots import BOUND_LABEL, throughput_figure

    results = [_throughput("tgserve", 64.0, 2.0), _throughput("transformers", 16.0, None)]
    (ax,) = throughput_figure(results).axes
    assert [p.get_height() for p in ax.patches] == [64.0, 16.0]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["tgserve", "transformers"]
    (bound,) = ax.lines  # only tgserve carries bound_s: 512 output tokens / 2 s
    assert bound.get_label() == BOUND_LABEL and list(bound.get_ydata()) == [256.0, 256.0]
    assert min(bound.get_xdata()) < ax.patches[0].get_x() + ax.patches[0].get_width() / 2


def test_latency_bars_for_prefill_and_decode_with_their_bounds():
    pytest.importorskip("matplotlib")
    from bench.plots import latency_figure

    results = [_latency("a", 900.0, 30.0, (5000.0, 90.0)), _latency("b", 400.0, 12.0, (None, None))]
    prefill_ax, decode_ax = latency_figure(results).axes
    assert [p.get_height() for p in prefill_ax.patches] == [900.0, 400.0]
    assert [p.get_height() for p in decode_ax.patches] == [30.0, 12.0]
    assert [list(line.get_ydata()) for line in prefill_ax.lines] == [[5000.0, 5000.0]]
    assert [list(line.get_ydata()) for line in decode_ax.lines] == [[90.0, 90.0]]


@pytest.mark.parametrize("kind", ["serve", "throughput", "latency"])
def test_plot_results_writes_a_png_matplotlib_reads_back(tmp_path, kind):
    pytest.importorskip("matplotlib")
    import matplotlib.image

    from bench.plots import plot_results

    results = {
        "serve": SWEEPS["tgserve"],
        "throughput": [_throughput("tgserve", 64.0, 2.0)],
        "latency": [_latency("a", 900.0, 30.0, (None, 90.0))],
    }[kind]
    path = plot_results(results, tmp_path / "sub" / f"{kind}.png", "tgserve")
    assert path.read_bytes()[:8] == PNG_SIGNATURE
    height, width, channels = matplotlib.image.imread(path).shape
    assert width > 300 and height > 300 and channels in (3, 4)


def test_plot_results_refuses_mixed_or_empty_results(tmp_path):
    pytest.importorskip("matplotlib")
    from bench.plots import plot_results

    with pytest.raises(ValueError, match="--plot"):
        plot_results([SWEEPS["other"][0], _throughput("a", 1.0, None)], tmp_path / "x.png", "a")
    with pytest.raises(ValueError, match="--plot"):
        plot_results([], tmp_path / "x.png", "a")


def test_a_missing_matplotlib_names_the_plot_extra(monkeypatch):
    import builtins

    from bench import plots

    real_import = builtins.__import__

    def no_matplotlib(name, *args, **kwargs):
        if name.split(".")[0] == "matplotlib":
            raise ImportError(f"No module named {name!r}")
        return real_import(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_matplotlib)
    with pytest.raises(ValueError, match=r"tgserve\[plot\]"):
        plots.require_matplotlib()


# ----- --sweep parsing and the loop over points ------------------------------------------------


def test_parse_sweep_reads_concurrency_and_request_rate_values():
    assert parse_sweep("concurrency=1,2, 4,8").values == (1, 2, 4, 8)
    assert parse_sweep("concurrency=8").attribute == "concurrency"
    rates = parse_sweep("request-rate=0.5,2,inf")
    assert rates.values == (0.5, 2.0, math.inf) and rates.attribute == "request_rate"


@pytest.mark.parametrize(
    "text",
    ["concurrency", "concurrency=", "batch=1,2", "concurrency=0,1", "concurrency=1.5",
     "concurrency=2,2", "request-rate=0", "request-rate=-1", "request-rate=nan", "request-rate=x"],
)  # fmt: skip
def test_parse_sweep_refuses_bad_text_naming_the_flag(text):
    with pytest.raises(ValueError, match="--sweep"):
        parse_sweep(text)


def test_run_sweep_runs_each_point_on_a_copy_of_the_arguments_in_order():
    args = argparse.Namespace(concurrency=None, request_rate=math.inf, num_requests=16)
    seen = []

    def fake_point(point_args):
        seen.append(vars(point_args).copy())
        return [replace(SWEEPS["tgserve"][0], concurrency=point_args.concurrency)], (
            f"limits@{point_args.concurrency}"
        )

    results, limits = run_sweep(args, parse_sweep("concurrency=4,1,2"), fake_point)
    assert [r.concurrency for r in results] == [4, 1, 2]
    assert [s["concurrency"] for s in seen] == [4, 1, 2]
    assert all(s["num_requests"] == 16 and s["request_rate"] == math.inf for s in seen)
    assert limits == "limits@4" and args.concurrency is None  # the caller's args untouched


def test_a_request_rate_sweep_keeps_the_concurrency_cap_and_a_concurrency_sweep_refuses_one():
    args = argparse.Namespace(concurrency=3, request_rate=math.inf)
    seen = []
    run_sweep(args, parse_sweep("request-rate=1,2"), lambda a: (seen.append(a) or [], None))
    assert [(a.concurrency, a.request_rate) for a in seen] == [(3, 1.0), (3, 2.0)]
    with pytest.raises(ValueError, match="--concurrency"):
        run_sweep(args, parse_sweep("concurrency=1,2"), lambda a: ([], None))


def test_serve_sweep_runs_every_point_against_a_server_and_plots_what_it_printed(tmp_path, capsys):
    """End to end through `tgserve bench serve` on the fake streaming server of
    test_bench_serve.py: one JSON result per point, in order, and the plot's points are theirs."""
    pytest.importorskip("matplotlib")
    pytest.importorskip("httpx")
    import json

    import matplotlib.image

    from server.cli import main
    from tests.bench.test_bench_serve import fake_streaming_server

    png = tmp_path / "sweep.png"
    args = "--num-requests 4 --input-len 6 --output-len 3 --vocab-size 7 --json --label fake"
    with fake_streaming_server(ttft=0.05, itl=0.02) as url:
        argv = ["bench", "serve", "--url", url, "--sweep", "concurrency=1,4", "--plot", str(png)]
        assert main([*argv, *args.split()]) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [r["concurrency"] for r in out] == [1, 4]
    assert all(r["completed"] == 4 and r["failed"] == 0 for r in out)
    # one at a time: 4 x (0.05 + 2 x 0.02) s; all four at once: about one request's time
    assert out[1]["output_tok_s"] > 2 * out[0]["output_tok_s"]
    assert png.read_bytes()[:8] == PNG_SIGNATURE and matplotlib.image.imread(png).shape[0] > 300


def test_serve_refuses_a_bad_sweep_before_sending_anything(capsys):
    from server.cli import main

    # nothing listens on port 9: a parsed sweep would fail on the connection instead
    assert main(["bench", "serve", "--url", "http://127.0.0.1:9", "--sweep", "batch=1,2"]) == 2
    assert "--sweep takes concurrency=" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("command", "fields"),
    [
        ("throughput", ("output_tok_s",)),
        ("latency", ("prefill_tok_s", "decode_tok_s")),
    ],
)
def test_offline_plot_draws_the_bars_of_what_the_command_printed(
    tmp_path, capsys, monkeypatch, command, fields
):
    """`bench throughput|latency --plot` on a tiny random checkpoint: the figure written holds
    one bar per backend with the values the command printed as JSON."""
    pytest.importorskip("matplotlib")
    import json

    import torch

    from bench import plots
    from server.cli import main
    from tests.checkpoints import save_checkpoint

    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a 2-layer model; two threads only fight a shared machine
    model = save_checkpoint("llama", tmp_path / "tiny-llama", seed=0)
    figures = []
    real_write_png = plots.write_png
    monkeypatch.setattr(
        plots, "write_png", lambda fig, path: (figures.append(fig), real_write_png(fig, path))[1]
    )
    shape = (
        "--num-requests 3 --input-len 6 --output-len 4"
        if command == "throughput"
        else "--input-len 6 --output-len 4 --runs 1"
    )
    png = tmp_path / f"{command}.png"
    argv = ["bench", command, "--model", str(model), "--dtype", "float32", *shape.split()]
    argv += ["--backend", "tgserve", "--backend", "transformers", "--skip-limits", "--json"]
    try:
        assert main([*argv, "--plot", str(png)]) == 0
    finally:
        torch.set_num_threads(threads)
    printed = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    assert [r["backend"] for r in printed] == ["tgserve", "transformers"]
    (fig,) = figures
    for ax, field in zip(fig.axes, fields, strict=True):
        assert [p.get_height() for p in ax.patches] == [r[field] for r in printed]
        assert not ax.lines  # --skip-limits: no bound to draw
    assert png.read_bytes()[:8] == PNG_SIGNATURE
