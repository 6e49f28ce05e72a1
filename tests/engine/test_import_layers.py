"""engine/ is built in layers, each importing only the layers below it (and its own), with no
import circle anywhere: the engine's floor plan, checked on the source.

The graph is read from the AST of every module under engine/: every `import` and `from ...
import` anywhere in a module (at the top, inside a function, under `if TYPE_CHECKING:`) is an
arrow, to the engine module it names (`from engine.x import y` is an arrow to `engine.x.y` when
that is a module, else to `engine.x`). The implicit import of a package's `__init__` that Python
performs is not an arrow. Every module must be placed in a layer, so a new module states where
it stands. The checker is itself tested on synthetic graphs: an upward arrow, a circle, an
unplaced module and a TYPE_CHECKING import are each reported. The torch floor is
test_torch_floor.py.
"""

from __future__ import annotations

import ast
from collections.abc import Iterable, Mapping
from pathlib import Path

ENGINE_DIR = Path(__file__).resolve().parents[2] / "engine"

# Bottom to top. A name covers that module and, when it is a package, everything under it;
# the longest name that covers a module places it ("engine" alone is only the front door).
LAYERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    (
        "types",
        (
            "engine.types",
            "engine.errors",
            "engine.config",
            "engine.kv_sizing",  # the KV pool's arithmetic from EngineConfig
            "engine.speculative.config",  # held by EngineConfig
            "engine.kv_tiers.config",  # held by EngineConfig
            "engine.lora_config",  # held by EngineConfig
            "engine.parallel_config",  # checks EngineConfig's parallel sizes
            "engine.host_transfer",
            "engine.fast_frozen",  # cheap constructors for the per-row frozen dataclasses
        ),
    ),
    # The runner and what it runs on: knows chunks by their shape, never requests.
    (
        "execution",
        (
            "engine.memory",
            "engine.step_inputs",
            "engine.kernel_switch",
            "engine.cuda_graphs",
            "engine.parallel",
            "engine.runner",
            "engine.model_runner",
            "engine.runner_factory",
            "engine.activation_choice",  # what runner_factory loads "auto" activations as
            "engine.description",
            "engine.encoder_layout",
            "engine.encdec_runner",
            "engine.fake_device",
            "engine.carried_inputs",  # the previous step's draws, for the next step's inputs
            "engine.kv_tiers",  # the K/V tiers behind the pool, and their copies
            "engine.kv_transfer",  # prefill/decode: the K/V channel, its sender and receiver
            # Below the runner boundary: the step's sampling, beam candidates, speculative
            # acceptance and prompt logprobs on the device (issue 38); host data in and out.
            "engine.sampling",
            "engine.grammar.host_mask",  # the grammars' masks, as the sampler reads them
            "engine.grammar.token_mask",
            "engine.speculative.acceptance",
        ),
    ),
    ("requests", ("engine.requests",)),
    ("grammar", ("engine.grammar",)),  # compiled and masked on the host
    ("scheduling", ("engine.scheduling",)),
    ("decoding", ("engine.decoding",)),
    ("speculation", ("engine.speculative",)),  # proposers, verification (issue #29)
    (
        "engine",
        (
            "engine",
            "engine.api",
            "engine.stats",
            "engine.request_state",
            "engine.lora_adapters",  # LoRA adapters by name, for intake and the engine
            "engine.intake",
            "engine.sampling_plan",  # what a step asks of the sampling (before the forward)
            "engine.plain_rows",  # the steady state's update in one pass (issue 38)
            "engine.step_update",
            "engine.step_launch",
            "engine.step_pipeline",
            "engine.faults",
            "engine.offline",
            "engine.warm_up",
            "engine.engine",
            "engine.engine_factory",
            "engine.drain_rate",
            "engine.engine_inbox",
            "engine.engine_loop",
            "engine.async_engine",
            "engine.tier_hooks",
            "engine.kv_transfer.link",  # prefill/decode: the engine's side (the export)
            "engine.sleep",
        ),
    ),
)

Graph = Mapping[str, set[str]]


def module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(source: str, modules: set[str]) -> set[str]:
    """The modules of `modules` that `source` imports, wherever the import statement is."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [f"{node.module}.{alias.name}" for alias in node.names]
            names = [n if n in modules else node.module for n in names]
        else:
            continue
        found.update(n for n in names if n in modules)
    return found


def import_graph(root: Path = ENGINE_DIR) -> dict[str, set[str]]:
    """Module -> the engine modules it imports (itself left out)."""
    paths = {module_name(p, root): p for p in sorted(root.rglob("*.py"))}
    names = set(paths)
    return {
        name: imported_modules(path.read_text(), names) - {name} for name, path in paths.items()
    }


def layer_of(module: str, layers=LAYERS) -> int | None:
    best: tuple[int, int] | None = None  # (length of the covering name, layer index)
    for index, (_, covers) in enumerate(layers):
        for name in covers:
            exact = module == name
            inside = name != "engine" and module.startswith(name + ".")
            if (exact or inside) and (best is None or len(name) > best[0]):
                best = (len(name), index)
    return None if best is None else best[1]


def unplaced(graph: Graph, layers=LAYERS) -> list[str]:
    return sorted(m for m in graph if layer_of(m, layers) is None)


def upward_arrows(graph: Graph, layers=LAYERS) -> list[str]:
    found = []
    for module, targets in sorted(graph.items()):
        here = layer_of(module, layers)
        for target in sorted(targets):
            there = layer_of(target, layers)
            if here is not None and there is not None and there > here:
                found.append(
                    f"{module} ({layers[here][0]}) imports {target} ({layers[there][0]}), "
                    "a layer above it"
                )
    return found


def circles(graph: Graph) -> list[list[str]]:
    """One circle per strongly connected group of two or more modules (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


# ----- the engine as it is ---------------------------------------------------------------------
def test_every_engine_module_has_a_layer() -> None:
    graph = import_graph()
    assert len(graph) > 40 and "engine.engine" in graph  # the walk found the source
    assert unplaced(graph) == [], "place these modules in LAYERS"


def test_no_engine_module_imports_a_layer_above_it() -> None:
    assert upward_arrows(import_graph()) == []


def test_engine_has_no_import_circle() -> None:
    assert circles(import_graph()) == []


def test_every_declared_name_exists() -> None:
    """A layer naming a module that is gone would place nothing (a stale floor plan)."""
    graph = import_graph()
    declared = [name for _, covers in LAYERS for name in covers]
    missing = [n for n in declared if not any(m == n or m.startswith(n + ".") for m in graph)]
    assert missing == []


# ----- the checker can fail ------------------------------------------------------------------
def _graph(edges: Iterable[tuple[str, str]], nodes: Iterable[str] = ()) -> dict[str, set[str]]:
    graph: dict[str, set[str]] = {n: set() for n in nodes}
    for a, b in edges:
        graph.setdefault(a, set()).add(b)
        graph.setdefault(b, set())
    return graph


def test_an_upward_arrow_is_reported_with_both_layers() -> None:
    graph = _graph([("engine.requests.request", "engine.grammar.grammar_engine")])
    assert upward_arrows(graph) == [
        "engine.requests.request (requests) imports engine.grammar.grammar_engine (grammar), "
        "a layer above it"
    ]
    assert (
        upward_arrows(_graph([("engine.grammar.grammar_engine", "engine.requests.request")])) == []
    )


def test_a_circle_is_reported_even_inside_one_layer() -> None:
    graph = _graph(
        [
            ("engine.scheduling.a", "engine.scheduling.b"),
            ("engine.scheduling.b", "engine.scheduling.c"),
            ("engine.scheduling.c", "engine.scheduling.a"),
            ("engine.scheduling.c", "engine.types"),
        ]
    )
    assert upward_arrows(graph) == []
    assert circles(graph) == [["engine.scheduling.a", "engine.scheduling.b", "engine.scheduling.c"]]


def test_a_module_outside_every_layer_is_reported() -> None:
    graph = _graph([], nodes=["engine.types", "engine.attic.old", "engine.requests.request"])
    assert unplaced(graph) == ["engine.attic.old"]
    assert layer_of("engine") == len(LAYERS) - 1 and layer_of("engine.enginex") is None


def test_type_checking_and_function_level_imports_are_arrows() -> None:
    source = (
        "from typing import TYPE_CHECKING\n"
        "import torch\n"
        "from engine.types import TokenLogprob\n"
        "from engine import offline\n"
        "if TYPE_CHECKING:\n"
        "    from engine.request_state import RequestState\n"
        "def build():\n"
        "    import engine.scheduling.scheduler\n"
    )
    modules = {
        "engine",
        "engine.types",
        "engine.offline",
        "engine.request_state",
        "engine.scheduling.scheduler",
    }
    assert imported_modules(source, modules) == modules - {"engine"}
    graph = {"engine.sampling.sampler": imported_modules(source, modules)}
    assert len(upward_arrows(graph)) == 3  # offline, request_state and the scheduler


def test_no_engine_module_is_over_300_lines() -> None:
    """One job per module (issue 28): a module past 300 lines holds more than one."""
    long = {
        str(path.relative_to(ENGINE_DIR)): n
        for path in sorted(ENGINE_DIR.rglob("*.py"))
        if (n := len(path.read_text().splitlines())) > 300
    }
    assert not long, f"engine modules over 300 lines: {long}"
