"""The Grafana dashboard (deploy/grafana/tgserve-dashboard.json) queries what the server exports.

Every panel's PromQL parses (promtool checks it as a recording rule, with Grafana's `$instance`
variable replaced by a regex); every metric it names is a sample in the /metrics of a server on
the real engine (a tiny random Llama) after a request and a refusal; every selector filters on the dashboard's
`instance` variable; and the panels the issue asked for (end-to-end latency, queue time) exist.
"""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families

from engine.config import EngineConfig
from engine.engine import Engine
from tests.debian_tools import debian_tool
from tests.server.live import LiveServer

DASHBOARD = Path(__file__).resolve().parents[2] / "deploy" / "grafana" / "tgserve-dashboard.json"
INSTANCE = '{instance=~"$instance"}'
# PromQL words that are not metric names (functions are followed by "(", so never taken)
KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "offset"}
KEYWORDS |= {"and", "or", "unless", "inf", "nan"}


def _exprs() -> list[str]:
    panels = json.loads(DASHBOARD.read_text())["panels"]
    return [target["expr"] for panel in panels for target in panel["targets"]]


def metric_names(expr: str) -> list[str]:
    """The metric names a PromQL expression selects, in order: identifiers outside label
    matchers, ranges, strings and grouping clauses, not called as functions."""
    bare = re.sub(r'"(?:[^"\\]|\\.)*"', '""', expr)  # strings
    bare = re.sub(r"\{[^}]*\}|\[[^\]]*\]", " ", bare)  # label matchers, ranges
    bare = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", bare)  # grouping labels
    names = re.findall(r"(?<![\w:.])([A-Za-z_:][\w:]*)(?![\w:])(?!\s*\()", bare)
    return [name for name in names if name.lower() not in KEYWORDS]


def test_metric_names_finds_selectors_and_skips_the_rest():
    expr = 'histogram_quantile(0.99, sum by (le, route) (rate(a_bucket{x="b c"}[5m]))) / b'
    assert metric_names(expr) == ["a_bucket", "b"]


def test_the_dashboard_has_the_asked_panels_and_an_instance_variable():
    dashboard = json.loads(DASHBOARD.read_text())
    variables = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert "instance" in variables["instance"]["query"]["query"]
    named = " ".join(_exprs())
    for metric in ("tgserve_e2e_request_latency_seconds", "tgserve_request_queue_time_seconds"):
        assert f"{metric}_bucket" in named
    for expr in _exprs():  # every selector of every query follows the instance variable
        matchers = re.findall(r"\{[^}]*\}", expr)
        assert matchers == [INSTANCE] * len(metric_names(expr)), expr


def test_every_panel_query_parses(tmp_path):
    promtool = debian_tool("promtool", "prometheus")
    rules = [
        {"record": f"dashboard:query_{i}", "expr": expr.replace("$instance", ".*")}
        for i, expr in enumerate(_exprs())
    ]
    path = tmp_path / "rules.json"  # YAML is a superset of JSON
    path.write_text(json.dumps({"groups": [{"name": "dashboard", "rules": rules}]}))
    checked = subprocess.run(
        [promtool, "check", "rules", str(path)], capture_output=True, text=True, timeout=60
    )
    assert checked.returncode == 0, checked.stdout + checked.stderr
    assert f"SUCCESS: {len(rules)} rules found" in checked.stdout


@pytest.fixture(scope="module")
def exported(tiny_model_folder) -> set[str]:
    """Every sample name of /metrics after one request on the real engine and one refused."""
    config = EngineConfig(dtype="float32", kv_cache_memory_bytes=2_000_000, block_size=4)
    with LiveServer(lambda: Engine.from_model(str(tiny_model_folder), config)) as live:
        body = {"prompt": "Hello world", "max_tokens": 3, "temperature": 0}
        assert httpx.post(live.url + "/v1/completions", json=body).status_code == 200
        refused = {**body, "max_tokens": -1}
        assert httpx.post(live.url + "/v1/completions", json=refused).status_code == 400
        text = httpx.get(live.url + "/metrics").text
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def test_every_metric_a_panel_names_is_exported(exported):
    for expr in _exprs():
        missing = set(metric_names(expr)) - exported
        assert not missing, f"{expr} names {missing}, not in /metrics"
