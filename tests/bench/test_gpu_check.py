"""The GPU check (bench/gpu_check/): the whole check as a CPU dry run (`--tiny`: every stage on
random:tiny-llama, a real offline pip install of a wheel made here, the report with every
section and every figure the stages printed), and the runner's degradation (a failing, a hanging
and a starved stage are recorded and the next stage runs), and the suite and target readings
against hand-written pytest output and figures."""

from __future__ import annotations

import json
import sys
import zipfile
from pathlib import Path

from bench.gpu_check.findings import suite_summary, targets
from bench.gpu_check.main import main
from bench.gpu_check.plan import Stage
from bench.gpu_check.report import SECTIONS
from bench.gpu_check.runner import StageResult, run_stages


def _wheel(folder: Path) -> Path:
    """A minimal pure-Python wheel (one module), as pip installs any other."""
    path = folder / "gpucheckprobe-0.1-py3-none-any.whl"
    info = "gpucheckprobe-0.1.dist-info"
    files = {
        "gpucheckprobe.py": "VALUE = 42\n",
        f"{info}/METADATA": "Metadata-Version: 2.1\nName: gpucheckprobe\nVersion: 0.1\n",
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\n"
        "Tag: py3-none-any\n",
    }
    record = "".join(f"{name},,\n" for name in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(path, "w") as z:
        for name, text in {**files, f"{info}/RECORD": record}.items():
            z.writestr(name, text)
    return path


def test_the_tiny_dry_run_runs_every_stage_and_reports_every_section(tmp_path, capsys):
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    _wheel(wheels)
    out, site = tmp_path / "out", tmp_path / "site"
    argv = ["--tiny", "--out", str(out), "--wheels", str(wheels), "--site", str(site)]
    assert main(argv) == 0
    assert (site / "gpucheckprobe.py").read_text() == "VALUE = 42\n"
    report = json.loads((out / "report.json").read_text())
    stages = {s["name"]: s for s in report["stages"]}
    names = ["install", "environment", "latency", "latency_invariant", "offline", "offline_wide"]
    names += ["serve", "serve_itl"]
    assert list(stages) == [*names, "profile", "suite"]
    assert {n: s["status"] for n, s in stages.items()} == dict.fromkeys(stages, "ok")
    f = report["figures"]
    assert f["environment"]["torch"] and f["environment"]["cuda_available"] is False
    assert f["machine"]["device"] == "cpu" and f["machine"]["peak_matmul_gflops"] > 0
    lat = f["latency"]
    assert lat["decode_tok_s"] > 0 and lat["decode_fraction_of_bound"] > 0
    assert lat["prefill_fraction_of_bound"] > 0
    assert sorted(f["offline"]) == ["tgserve", "transformers"]
    assert f["offline_wide"]["num_requests"] == 16 and f["offline_wide"]["output_tokens"] == 128
    assert f["serve"]["completed"] == 8 and f["serve"]["itl_p99_over_p50"] >= 1.0
    assert f["serve_itl"]["completed"] == 8
    assert f["latency_invariant"]["decode_tok_s"] > 0
    assert "--batch-invariant" in stages["latency_invariant"]["command"]
    assert "--target-itl-ms" in stages["serve_itl"]["command"]
    assert f["suite"]["counts"]["passed"] > 0 and f["suite"]["failing"] == []
    assert [b["batch"] for b in f["profile"]["batches"]] == [1, 4]
    assert all(b["top"] for b in f["profile"]["batches"])
    assert all(t["measured"] is not None for t in report["targets"])
    markdown = (out / "report.md").read_text()
    assert "CPU dry run" in markdown and "Not measured" not in markdown
    headings = [line[3:] for line in markdown.splitlines() if line.startswith("## ")]
    assert headings == list(SECTIONS)
    assert markdown in capsys.readouterr().out
    log = (out / "logs.txt").read_text()
    assert all(f"===== {name}:" in log for name in stages)
    assert len(list(out.iterdir())) <= 8  # what the device tool brings back


def _py(code: str) -> tuple[str, ...]:
    return (sys.executable, "-c", code)


def test_a_failing_hanging_or_starved_stage_is_recorded_and_the_next_runs(tmp_path):
    stages = [
        Stage("fails", "", _py("import sys; print('partial'); sys.exit(3)"), 30, min_s=1),
        Stage("hangs", "", _py("import time; print('started', flush=True); time.sleep(60)"), 2),
        Stage("next", "", _py('print(\'{"kind": "x"}\')'), 30, min_s=1),
        Stage("starved", "", _py("pass"), 1000, min_s=1000),
    ]
    with (tmp_path / "log.txt").open("w") as log:
        results = run_stages(stages, 60, {"PATH": "/usr/bin:/bin"}, log)
    status = {r.name: (r.status, r.rc) for r in results}
    assert status["fails"] == ("failed", 3) and "partial" in results[0].tail
    assert status["hangs"][0] == "timeout" and results[1].seconds < 10
    assert "started" in results[1].stdout  # what it printed before it was cut off is kept
    assert status["next"] == ("ok", 0) and results[2].stdout.startswith('{"kind"')
    assert status["starved"] == ("skipped", None) and "needs 1000" in results[3].reason
    assert "===== hangs:" in (tmp_path / "log.txt").read_text()


PYTEST_OUT = """\
.....F..s
FAILED tests/engine/decoding/test_beam_search.py::test_beam[llama] - RuntimeError: devices
ERROR tests/engine/test_structured_outputs.py - ImportError
=========== 2 failed, 304 passed, 8 skipped, 1 error in 133.76s (0:02:13) ===========
"""


CUT_OFF_OUT = """\
C++ CPU kernels built: True (41 s)
[gw0] [  1%] PASSED tests/engine/test_api.py::test_a
[gw1] [  2%] FAILED tests/engine/decoding/test_beam_search.py::test_beam[llama]
tests/models/test_attention.py::test_b SKIPPED (needs cuda)                 [  3%]
tests/models/test_attention.py::test_c PASSED                                [  4%]
"""


def _result(name: str, stdout: str) -> StageResult:
    return StageResult(name, name, "cmd", "failed", 1, 1.0, 10.0, stdout, "")


def test_the_suite_summary_and_the_targets_read_what_was_printed():
    suite = suite_summary(_result("suite", PYTEST_OUT))
    assert suite["counts"] == {"failed": 2, "passed": 304, "skipped": 8, "errors": 1}
    assert suite["failing"] == [
        "FAILED tests/engine/decoding/test_beam_search.py::test_beam[llama]",
        "ERROR tests/engine/test_structured_outputs.py",
    ]
    cut = suite_summary(_result("suite", CUT_OFF_OUT))  # killed before pytest's summary
    assert cut["counts"] == {"passed": 2, "failed": 1, "skipped": 1}
    assert cut["failing"] == ["FAILED tests/engine/decoding/test_beam_search.py::test_beam[llama]"]
    assert cut["summary"].startswith("cut off before pytest's summary")
    figures = {
        "latency": {"decode_fraction_of_bound": 0.81, "prefill_fraction_of_bound": 0.33},
        "offline": {"tgserve": {"output_tok_s": 1761.0}, "transformers": {"output_tok_s": 657.0}},
        "offline_wide": {"output_tok_s": 10002.0},
        "serve": {"itl_p99_over_p50": 1.6},
        "suite": suite,
    }
    rows = {r["what"].split(",")[0]: r for r in targets(figures)}
    assert rows["CUDA suite: failed + errors"]["measured"] == 3
    assert rows["CUDA suite: failed + errors"]["met"] is False
    assert rows["batch-1 decode"]["met"] is True
    assert abs(rows["offline 64 x 512/256 vs transformers"]["measured"] - 1761 / 657) < 1e-9
    assert rows["offline 64 x 512/256 vs transformers"]["met"] is False
    assert rows["offline 256 x 512/256"]["met"] is True  # 3 x 3,334 = 10,002
    assert rows["512-token prefill"]["met"] is False and rows["serving 64 streams"]["met"] is False
    assert all(r["met"] is None for r in targets(dict.fromkeys(figures)))
