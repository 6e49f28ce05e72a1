"""The torch floor of engine/ (issue 38), on the layers of test_import_layers.py: device
tensors stay at and below the runner, so only the "types" and "execution" layers may import
torch (anywhere in a module). Sampling, beam candidates, speculative acceptance and prompt
logprobs run below the runner (engine/sampling/step_sampler.py), so `TORCH_ABOVE_THE_RUNNER`,
the list of modules above it that still import torch, is empty: no module may join it.
"""

from __future__ import annotations

import ast
from collections.abc import Mapping

from tests.engine.test_import_layers import ENGINE_DIR, LAYERS, layer_of, module_name

TORCH_FLOOR = "execution"  # the highest layer that may import torch
TORCH_ABOVE_THE_RUNNER: frozenset[str] = frozenset()  # the debt is paid (issue 38)


def imports_torch(source: str) -> bool:
    """Whether any import statement of `source` (wherever it stands) names torch."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module]
        else:
            continue
        if any(n == "torch" or n.startswith("torch.") for n in names):
            return True
    return False


def torch_above_the_runner(sources: Mapping[str, str], layers=LAYERS) -> set[str]:
    """The modules of `sources` (name -> source) above the torch floor that import torch."""
    floor = [name for name, _ in layers].index(TORCH_FLOOR)
    return {
        m
        for m, source in sources.items()
        if (layer_of(m, layers) or 0) > floor and imports_torch(source)
    }


def test_torch_stays_at_and_below_the_runner() -> None:
    sources = {module_name(p, ENGINE_DIR): p.read_text() for p in ENGINE_DIR.rglob("*.py")}
    found = torch_above_the_runner(sources)
    assert found - TORCH_ABOVE_THE_RUNNER == set(), "torch above the runner: keep it below"
    assert TORCH_ABOVE_THE_RUNNER - found == set(), "no longer imports torch: drop it from the list"


def test_a_planted_torch_import_above_the_runner_is_reported() -> None:
    planted = "def f():\n    from torch.nn import functional\n"
    sources = {
        "engine.scheduling.scheduler": planted,  # above the floor: reported
        "engine.model_runner": "import torch\n",  # the runner's floor: allowed
        "engine.requests.request": "import torchvision\nfrom engine import torch_free\n",
    }
    assert torch_above_the_runner(sources) == {"engine.scheduling.scheduler"}
