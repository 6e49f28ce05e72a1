"""server/ is laid out as one folder per API on shared pieces (README "server/"): read from the
source (AST, TYPE_CHECKING imports included), so a new module is covered without editing this.

- no import circle among server's modules;
- server/openai/ and server/tgi/ never import each other, and the shared modules import
  neither (only the app factory and the OpenAPI document, which assemble the APIs, do);
- no route module (each API's router.py, operations.py) is imported by anything but the app;
- no module is longer than 300 lines;
- the tests' fake engine imports only the engine's front door (engine/__init__.py).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "server"
ASSEMBLY = {"server.app", "server.openapi"}  # where the APIs meet
ROUTE_MODULES = {
    "server.openai.router",
    "server.anthropic.router",
    "server.responses.router",
    "server.tgi.router",
    "server.operations",
}
API_FOLDERS = ("server.openai", "server.anthropic", "server.responses", "server.tgi")


def _name(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


MODULES = {_name(path): path for path in SERVER.rglob("*.py")}


def _imports(name: str) -> set[str]:
    """The server modules `name` imports (a `from package import module` names the module)."""
    found = set()
    for node in ast.walk(ast.parse(MODULES[name].read_text())):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            targets = [f"{node.module}.{alias.name}" for alias in node.names] + [node.module]
        else:
            continue
        hits = [t for t in targets if t in MODULES]
        if isinstance(node, ast.ImportFrom):  # the submodules it names, else the module itself
            named = [t for t in hits if t != node.module]
            hits = named or [t for t in hits if t == node.module]
        found.update(hits)
    found.discard(name)
    return found


GRAPH = {name: _imports(name) for name in MODULES}


def _api_of(name: str) -> str | None:
    return next((api for api in API_FOLDERS if name == api or name.startswith(api + ".")), None)


def test_the_graph_sees_the_layout():
    assert GRAPH["server.app"] >= ROUTE_MODULES
    assert "server.openai.serving" in GRAPH["server.openai.serving_chat"]
    assert "server.state" in GRAPH["server.tgi.serving"]


def test_no_import_circle_in_server():
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            raise AssertionError("import circle: " + " -> ".join([*path[path.index(name) :], name]))
        if name in done:
            return
        for target in sorted(GRAPH[name]):
            visit(target, [*path, name])
        done.add(name)

    for name in sorted(GRAPH):
        visit(name, [])


def test_each_api_imports_only_itself_and_the_shared_pieces():
    for name, targets in GRAPH.items():
        own = _api_of(name)
        for target in targets:
            api = _api_of(target)
            if api is None or api == own or name in ASSEMBLY:
                continue
            raise AssertionError(f"{name} imports {target} of another API")


def test_no_route_module_is_imported_but_by_the_app():
    for name, targets in GRAPH.items():
        if name != "server.app":
            assert not targets & ROUTE_MODULES, (name, targets & ROUTE_MODULES)


def test_no_server_module_is_over_300_lines():
    long = {
        name: n for name, path in MODULES.items() if (n := len(path.read_text().splitlines())) > 300
    }
    assert not long, long


def test_the_fake_engine_imports_only_the_engines_front_door():
    tree = ast.parse((ROOT / "tests" / "server" / "fake_engine.py").read_text())
    engine_imports = {
        node.module
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "engine"
    }
    assert engine_imports == {"engine"}
