"""Reads a PEFT LoRA folder (`adapter_config.json` + `adapter_model.safetensors`) into a
`LoraAdapter`, refusing with the reason what tgserve cannot apply.

Contract: `load_peft_folder(path, name, config)` returns the adapter (its tensors in float32 on
the CPU; the bank casts them into its slot) or raises `LoraRefused` naming the reason: not a
folder / missing file, a peft_type other than LORA, DoRA (`use_dora`), `modules_to_save`,
trained biases (`bias` other than "none", `lora_bias`), trainable tokens, embedding or LM-head
adapters, a module outside q/k/v/o/gate/up/down, or shapes that do not fit the base model.
Scaling follows PEFT: `lora_alpha / r` (or `/ sqrt(r)` with `use_rslora`), where r and alpha
of a module come from `rank_pattern` / `alpha_pattern` when a key matches its name (PEFT's
rule: the key is a regex for the name's tail), else `r` / `lora_alpha`; the tensors' rank must
agree with that r.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import torch

from models.lora.adapter import (
    REFUSED_MODULES,
    TARGET_MODULES,
    LoraAdapter,
    LoraRefused,
    ModuleLora,
    lora_scale,
)

CONFIG_FILE = "adapter_config.json"
WEIGHTS_FILE = "adapter_model.safetensors"
# "base_model.model.model.layers.3.self_attn.q_proj.lora_A.weight" (an adapter name such as
# ".default" may sit before ".weight" in files saved by hand).
_KEY = re.compile(
    r"^(?:base_model\.model\.)?(?P<module>.+)\.lora_(?P<ab>[AB])(?:\.[^.]+)?\.weight$"
)
_LAYER = re.compile(r"(?:^|\.)layers\.(?P<layer>\d+)\.(?:self_attn|mlp)\.(?P<proj>\w+)$")
# Config keys whose truthy value asks for something tgserve does not apply.
_UNSUPPORTED = {
    "use_dora": "DoRA adapters (use_dora) are not supported",
    "modules_to_save": "modules_to_save (fully trained extra modules) is not supported",
    "lora_bias": "LoRA biases (lora_bias) are not supported",
    "trainable_token_indices": "trainable tokens are not supported",
    "layer_replication": "layer_replication is not supported",
    "target_parameters": "target_parameters (LoRA on parameters) is not supported",
}


def load_peft_folder(path: str | Path, name: str, config: Any) -> LoraAdapter:
    folder = Path(path)
    cfg = _read_config(folder, name)
    tensors = _read_tensors(folder / WEIGHTS_FILE, name)
    pairs: dict[str, dict[str, torch.Tensor]] = {}
    for key, tensor in tensors.items():
        m = _KEY.match(key)
        if m is None:
            tail = key.split(".")[-2] if "." in key else key
            what = "embedding" if "embedding" in key else tail
            raise LoraRefused(f"adapter {name!r}: tensor {key!r} ({what}) is not a LoRA A/B pair")
        pairs.setdefault(m["module"], {})[m["ab"]] = tensor
    modules: dict[tuple[int, str], ModuleLora] = {}
    for module_name, ab in sorted(pairs.items()):
        layer, proj = _target(module_name, name)
        if set(ab) != {"A", "B"}:
            raise LoraRefused(f"adapter {name!r}: {module_name} lacks lora_A or lora_B")
        a, b = ab["A"].float(), ab["B"].float()
        rank = _pattern(cfg.get("rank_pattern") or {}, module_name, cfg.get("r", 8))
        if a.shape[0] != rank:
            raise LoraRefused(
                f"adapter {name!r}: {module_name} has rank {a.shape[0]} in its tensors but "
                f"{rank} in {CONFIG_FILE}"
            )
        alpha = _pattern(cfg.get("alpha_pattern") or {}, module_name, cfg.get("lora_alpha", 8))
        scale = lora_scale(float(alpha), rank, bool(cfg.get("use_rslora")))
        modules[(layer, proj)] = ModuleLora(a=a, b=b, scale=scale)
    if not modules:
        raise LoraRefused(f"adapter {name!r}: {WEIGHTS_FILE} holds no LoRA tensors")
    adapter = LoraAdapter(name=name, modules=modules)
    adapter.check_fits(config)
    return adapter


def _read_config(folder: Path, name: str) -> dict[str, Any]:
    if not (folder / CONFIG_FILE).is_file() or not (folder / WEIGHTS_FILE).is_file():
        raise LoraRefused(
            f"adapter {name!r}: {folder} is not a PEFT LoRA folder (needs {CONFIG_FILE} and "
            f"{WEIGHTS_FILE})"
        )
    try:
        cfg = json.loads((folder / CONFIG_FILE).read_text())
    except (OSError, ValueError) as exc:
        raise LoraRefused(f"adapter {name!r}: unreadable {CONFIG_FILE}: {exc}") from exc
    kind = cfg.get("peft_type", "LORA")
    if str(kind).upper() != "LORA":
        raise LoraRefused(f"adapter {name!r}: peft_type {kind!r} is not LORA")
    for key, why in _UNSUPPORTED.items():
        if cfg.get(key):
            raise LoraRefused(f"adapter {name!r}: {why}")
    if cfg.get("bias", "none") != "none":
        raise LoraRefused(
            f"adapter {name!r}: trained biases (bias={cfg['bias']!r}) are not supported"
        )
    targets = cfg.get("target_modules") or []
    for module in [targets] if isinstance(targets, str) else targets:
        if module in REFUSED_MODULES:
            raise LoraRefused(f"adapter {name!r}: {REFUSED_MODULES[module]}")
    return cfg


def _read_tensors(path: Path, name: str) -> dict[str, torch.Tensor]:
    from safetensors.torch import load_file

    try:
        return load_file(str(path), device="cpu")
    except Exception as exc:  # a truncated or foreign file: the reason, not a traceback
        raise LoraRefused(f"adapter {name!r}: unreadable {path.name}: {exc}") from exc


def _target(module_name: str, name: str) -> tuple[int, str]:
    """'model.layers.3.self_attn.q_proj' -> (3, 'q_proj'), or LoraRefused saying why not."""
    tail = module_name.rsplit(".", 1)[-1]
    if tail in REFUSED_MODULES:
        raise LoraRefused(f"adapter {name!r}: {REFUSED_MODULES[tail]}")
    m = _LAYER.search(module_name)
    if m is None or m["proj"] not in TARGET_MODULES:
        raise LoraRefused(
            f"adapter {name!r}: unknown target module {module_name!r} (tgserve applies LoRA to "
            f"{', '.join(TARGET_MODULES)})"
        )
    return int(m["layer"]), m["proj"]


def _pattern(patterns: dict[str, Any], module_name: str, default: Any) -> Any:
    """PEFT's per-module override: the first key that matches the name's tail."""
    for key, value in patterns.items():
        if re.match(rf"(.*\.)?({key})$", module_name):
            return value
    return default
