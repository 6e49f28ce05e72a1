"""`tgserve bench` runs on the base install: every third-party module bench/ imports (read from
its source, imports inside functions included) belongs to a distribution pyproject.toml lists
as a runtime dependency, or is one of the named exceptions: the peers bench measures tgserve
against (each installed by whoever compares) and matplotlib, the `plot` extra behind --plot.
`bench serve` once failed with "needs httpx", which no documented install line provided.
The module-to-distribution map is the installed environment's own (importlib.metadata).
"""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib import metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[2]
OWN = {"bench", "engine", "models", "server"}
PEERS = {"transformers", "llama_cpp", "vllm"}  # bench's comparison backends, imported when chosen
EXTRAS = {"matplotlib": "plot"}


def _third_party_imports() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {}
    for path in (ROOT / "bench").rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            else:
                continue
            for name in names:
                top = name.split(".")[0]
                if top not in sys.stdlib_module_names and top not in OWN:
                    found.setdefault(top, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_module_bench_imports_comes_with_the_base_install():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    base = {canonicalize_name(Requirement(r).name) for r in project["dependencies"]}
    plot = {
        canonicalize_name(Requirement(r).name) for r in project["optional-dependencies"]["plot"]
    }
    distributions = metadata.packages_distributions()
    imports = _third_party_imports()
    assert "httpx" in imports  # the scan sees bench serve's client
    for module, files in sorted(imports.items()):
        if module in PEERS:
            continue
        names = {canonicalize_name(d) for d in distributions.get(module, [module])}
        wanted = plot if EXTRAS.get(module) == "plot" else base
        assert names & wanted, f"{module} (imported by {sorted(files)}) is not in {wanted}"
