"""/metrics and /info say which path runs the steps: tgserve's C++ CPU kernels or PyTorch ops
(while the kernels build in the background, engine/kernel_switch.py, or when turned off).

Oracle: the engine's own forward path (`runner.forward_path` and its `attention_kernel`) of a real
engine on the tiny model, with the kernels on and off.
"""

from __future__ import annotations

import httpx
import pytest

from engine.config import EngineConfig
from engine.engine import Engine
from tests.server.live import LiveServer, metric


@pytest.mark.parametrize("kernels", [True, False], ids=["kernels", "pytorch"])
def test_metrics_and_info_name_the_path_that_serves(tiny_model_folder, kernels) -> None:
    config = EngineConfig(
        dtype="float32", kv_cache_memory_bytes=2_000_000, block_size=4, cpu_kernels=kernels
    )
    with LiveServer(lambda: Engine.from_model(str(tiny_model_folder), config)) as live:
        runner = live.state.engine.engine.runner
        assert runner.forward_path.attention_kernel == kernels
        text = httpx.get(live.url + "/metrics").text
        assert metric(text, "tgserve_cpu_kernels_active") == float(kernels)
        info = httpx.get(live.url + "/info").json()
        assert info["forward_path"] == runner.forward_path.description
        assert ("C++" in info["forward_path"]) == kernels
