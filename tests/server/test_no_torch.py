"""DESIGN.md: no module of server/ imports torch (the HTTP layer stays light to import and test)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MODULES = [
    "server.app",
    "server.serve",
    "server.settings",
    "server.errors",
    "server.schemas",
    "server.schemas_openai",
    "server.schemas_tgi",
    "server.routes_openai",
    "server.routes_tgi",
    "server.routes_misc",
    "server.streaming",
    "server.metrics",
    "engine.async_engine",
]


def test_importing_the_http_layer_does_not_import_torch():
    code = f"import sys\nfor m in {MODULES!r}: __import__(m)\nprint('torch' in sys.modules)"
    result = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"
