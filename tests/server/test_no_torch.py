"""DESIGN.md: no module of server/ imports torch or the model code (the HTTP layer stays light to
import and test), and server/ reaches the benchmark tool (bench/) only when `tgserve bench` runs.

Every module under server/ is found on disk, so a new one is covered without editing this list;
each check runs in a fresh interpreter, where nothing was imported before."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER_MODULES = sorted(
    ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
    for path in (ROOT / "server").rglob("*.py")
)
MODULES = [*SERVER_MODULES, "engine.async_engine"]
FORBIDDEN = ("torch", "models", "bench")  # top-level packages, with their submodules


def _imported_after(code: str) -> list[str]:
    """Runs `code` in a fresh interpreter; the FORBIDDEN modules it left in sys.modules."""
    probe = (
        f"import json, sys\n{code}\n"
        f"print(json.dumps(sorted(m for m in sys.modules if m.split('.')[0] in {FORBIDDEN!r})))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_every_server_module_is_covered():
    assert {"server.app", "server.cli", "server.serve", "server.openai.router"} <= set(MODULES)
    assert not any(m.startswith("server.bench") for m in MODULES)  # bench/ is its own package


def test_importing_all_of_server_imports_no_torch_no_models_no_bench():
    assert _imported_after(f"for m in {MODULES!r}: __import__(m)") == []


def test_the_cli_parser_imports_bench_only_for_the_bench_subcommand():
    build = "from server.cli import build_parser\n"
    assert _imported_after(build + "build_parser(None); build_parser('serve')") == []
    assert "bench.cli" in _imported_after(build + "build_parser('bench')")
