"""bench/ drives tgserve's engine through its front door only (issue 28), so the engine's insides
can move without breaking the benchmarks.

The front door is the `engine` package itself: `import engine` and `from engine import NAME` for a
NAME in `engine.__all__` (engine/__init__.py), and what those objects offer (`Engine.describe()`,
`Engine.stats()`, `EngineInfo`, ...). Not the front door: any `engine.<module>` import
(`from engine.model_runner import ...`, `import engine.scheduling.scheduler`, a module path handed
to importlib or `python -m`), and the engine's runner (`.runner`, `getattr(x, "runner")`).

bench/ may import `models`: kernel microbenchmarks time models' kernels and layers directly, and
bench reads checkpoints, GGUF files, tokenizers, model shapes and random weights through it; that
is the floor below the engine, not the engine's insides. One exception: `models.forward_path`,
which forward path a loaded engine runs is the engine's to say (`Engine.describe()`).

Every module under bench/ is found on disk and parsed (imports inside functions included), so a
new module is covered without editing this list."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import engine

ROOT = Path(__file__).resolve().parents[2]
BENCH_FILES = sorted((ROOT / "bench").rglob("*.py"))
FORBIDDEN_MODELS = ("models.forward_path",)
MODULE_PATH = re.compile(r"engine(\.[A-Za-z_]\w*)+")  # "engine.x.y": an engine submodule


def _forbidden_module(name: str) -> bool:
    return name.startswith("engine.") or any(
        name == m or name.startswith(m + ".") for m in FORBIDDEN_MODELS
    )


def _names_the_insides(value: object) -> bool:
    """A string naming the runner (getattr) or an engine submodule (importlib, `python -m`)."""
    return isinstance(value, str) and (value == "runner" or bool(MODULE_PATH.fullmatch(value)))


def violations(source: str) -> list[str]:
    """What `source` (a module's text) does past the engine's front door, one line each."""
    found = []
    for node in ast.walk(ast.parse(source)):
        where = f"line {getattr(node, 'lineno', '?')}"
        if isinstance(node, ast.Import):
            found += [f"{where}: import {a.name}" for a in node.names if _forbidden_module(a.name)]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if _forbidden_module(node.module):
                found.append(f"{where}: from {node.module} import")
            elif node.module == "engine":
                private = [a.name for a in node.names if a.name not in engine.__all__]
                found += [f"{where}: from engine import {name} (not exported)" for name in private]
        elif isinstance(node, ast.Attribute) and node.attr == "runner":
            found.append(f"{where}: .runner")
        elif isinstance(node, ast.Constant) and _names_the_insides(node.value):
            found.append(f"{where}: {node.value!r}")
    return found


def test_the_checker_flags_each_way_past_the_front_door():
    # Hand-written cases: each line of `bad` is one way in, `good` holds what bench may do.
    bad = (
        "from engine.model_runner import ModelRunner\n"
        "import engine.scheduling.scheduler\n"
        "def f(e):\n"
        "    from engine.config import dtype_bytes\n"
        "    from engine import ModelRunner\n"
        "    from models.forward_path import CppStepPath\n"
        "    x = e.runner.kv_caches\n"
        "    y = getattr(e, 'runner')\n"
        "    importlib.import_module('engine.stats')\n"
    )
    assert len(violations(bad)) == 8, violations(bad)
    good = (
        "import engine\n"
        "from engine import Engine, EngineConfig, SamplingParams, dtype_bytes\n"
        "from models.loader import load_model\n"
        "from bench.gpu_check.runner import run_stages\n"
        "def f(e):\n"
        "    return e.describe().held_bytes, e.stats().kv_blocks_used, e.info.kv_blocks_total\n"
        "'''The engine. Steps run; engine.step() is called.'''\n"
    )
    assert violations(good) == []


def test_every_bench_module_is_covered():
    names = {p.relative_to(ROOT).as_posix() for p in BENCH_FILES}
    assert {"bench/backends/tgserve.py", "bench/kv_usage.py", "bench/decode_layers.py"} <= names


def test_no_bench_module_reaches_past_the_engines_front_door():
    found = {
        path.relative_to(ROOT).as_posix(): v
        for path in BENCH_FILES
        if (v := violations(path.read_text(encoding="utf-8")))
    }
    assert found == {}
