"""The compiled fast path equals the eager reference it wraps (fp32, 1e-4), through prefill
and decode steps with changing batch sizes, on the tests' device (`--compile` on a GPU
compiles to Triton, on a CPU to C++)."""

from __future__ import annotations

import pytest
import torch

from models import build_model
from models.compiled_layers import compile_dense_halves
from models.config import ModelConfig
from tests.checkpoints import VOCAB, make_hf_model
from tests.models.paged_driver import PagedDriver


def _model(hf, device: torch.device):
    config = ModelConfig.from_hf_dict(hf.config.to_dict())
    model = build_model(config, torch.float32, device)
    model.load_weights(hf.state_dict().items())
    return model


@pytest.mark.parametrize("arch", ["llama", "gpt2"])
def test_compiled_blocks_equal_eager(arch: str, device) -> None:
    hf = make_hf_model(arch)
    eager, fast = _model(hf, device), _model(hf, device)
    assert compile_dense_halves(fast) == hf.config.num_hidden_layers
    drivers = [PagedDriver(eager, block_size=4), PagedDriver(fast, block_size=4)]
    gen = torch.Generator().manual_seed(0)
    prompts = [torch.randint(3, VOCAB, (n,), generator=gen).tolist() for n in (7, 19, 3)]
    for d in drivers:
        for _ in prompts:
            d.add_sequence()
    steps = [
        {0: prompts[0], 1: prompts[1]},
        {0: [5], 1: [6], 2: prompts[2]},
        {0: [7], 1: [8], 2: [9]},
        {2: [10]},
    ]
    for feed in steps:
        ref = drivers[0].step(feed)
        out = drivers[1].step(feed)
        for seq in feed:
            torch.testing.assert_close(out[seq], ref[seq], atol=1e-4, rtol=0)
