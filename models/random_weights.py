"""A model of a given shape with seeded random weights, built in memory (no checkpoint).

Contract: `random_model(hf_config, dtype, device, seed=0) -> (model, ModelConfig)` builds the
model `hf_config` (a transformers-style config.json dict) describes, directly on `device` in
`dtype`, and fills it: norm weights 1, biases 0, every other tensor N(0, 0.02) drawn from one
generator on `device` seeded with `seed`, parameter by parameter in name order (the same seed
gives the same weights on the same device). Tied embeddings stay tied. Weights are
meaningless, so the model is for measuring speed (bench's `random:` models), never quality;
an 8B shape in bf16 takes its 16 GB on the device and nothing more (no host copy).
"""

from __future__ import annotations

from typing import Any

import torch

from models.config import ModelConfig

INIT_STD = 0.02  # as transformers' initializer_range: activations stay finite through the layers


def random_model(
    hf_config: dict[str, Any],
    dtype: torch.dtype,
    device: torch.device | str,
    seed: int = 0,
) -> tuple[torch.nn.Module, ModelConfig]:
    from models import build_model  # models/__init__ imports the model classes

    config = ModelConfig.from_hf_dict(hf_config)
    device = torch.device(device)
    model = build_model(config, dtype, device)
    generator = torch.Generator(device=device).manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters(), key=lambda item: item[0]):
            if param.dim() == 1 and name.endswith(".weight"):  # the norms' scales
                param.fill_(1.0)
            elif name.endswith(".bias"):
                param.zero_()
            else:
                param.normal_(0.0, INIT_STD, generator=generator)
    return model.eval(), config
