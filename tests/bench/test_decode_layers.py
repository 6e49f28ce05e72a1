"""bench/decode_layers.py: the groups cover every matrix kept as stored, once, in forward order,
and a timed pass calls each group's kernels (a tiny random GGUF written by bench.random_gguf)."""

from __future__ import annotations

import torch

from bench.decode_layers import linear_groups, time_pass
from models import cpu_kernels
from models.block_linear import BlockLinear
from models.loader import load_model


def test_groups_cover_every_stored_matrix_once_and_a_pass_times_each(tiny_q4_1_gguf):
    model, config = load_model(tiny_q4_1_gguf, "bfloat16", "cpu")
    layers = linear_groups(model)
    stored = [m for m in model.modules() if isinstance(m, BlockLinear)]
    assert [layer for _, layer in layers] == stored  # each once, in module (forward) order
    keys = {key for key, _ in layers}
    h, inter = config.hidden_size, config.intermediate_size
    assert f"gate_up_proj Q4_1 {2 * inter}x{h}" in keys and f"down_proj Q4_1 {h}x{inter}" in keys
    assert [key.split()[0] for key, _ in layers[:4]] == [
        "qkv_proj",
        "o_proj",
        "gate_up_proj",
        "down_proj",
    ]
    xs = {k: torch.randn(1, k).bfloat16() for k in {layer.in_features for _, layer in layers}}
    seconds = time_pass(cpu_kernels.extension(), layers, xs)
    assert set(seconds) == keys and all(s > 0 for s in seconds.values())
