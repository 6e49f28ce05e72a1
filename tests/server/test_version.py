"""tgserve's version, from the installed distribution's metadata (the oracle: importlib.metadata
and pyproject.toml), is what `tgserve --version`, GET /version and the OpenAPI document say;
/version answers while the model is still loading (an operator asks what is starting)."""

from __future__ import annotations

import threading
import tomllib
from importlib import metadata
from pathlib import Path

import httpx
import pytest

from server.cli import main
from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"


def _expected() -> str:
    declared = tomllib.loads(PYPROJECT.read_text())["project"]["version"]
    assert metadata.version("tgserve") == declared  # the installed metadata is this checkout's
    return declared


def test_the_command_prints_its_version(capsys):
    with pytest.raises(SystemExit) as exited:
        main(["--version"])
    assert exited.value.code == 0
    assert capsys.readouterr().out.strip() == f"tgserve {_expected()}"


def test_the_route_and_the_document_say_the_same_version():
    with LiveServer(FakeEngine) as live:
        assert httpx.get(live.url + "/version").json() == {"version": _expected()}
        assert httpx.get(live.url + "/openapi.json").json()["info"]["version"] == _expected()


def test_the_route_answers_while_the_model_loads():
    release = threading.Event()

    def slow_engine():
        release.wait(10)
        return FakeEngine()

    with LiveServer(slow_engine, wait_ready=False) as live:
        try:
            assert httpx.get(live.url + "/ready").status_code == 503
            assert httpx.get(live.url + "/version").json() == {"version": _expected()}
        finally:
            release.set()
