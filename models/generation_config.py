"""generation_config.json: the generation settings a Hugging Face folder ships beside config.json.

transformers' `generate` reads its token ids and defaults from this file (config.json's copies
only when the folder has none); vLLM takes its sampling keys as default sampling parameters.
Here the loader (models/loader.py) gives config.json the file's token ids and keeps the whole
file on `ModelConfig.generation`, from which the engine takes the request defaults it honours
(engine/requests/generation_defaults.py).

Contract: `read_generation_config(folder)` is the file's dict ({} when the folder has none or
the file holds no JSON object); `with_generation_token_as_id_tuple(hf_config, generation)` is config.json's
dict with the file's `decoder_start_token_id`, `forced_bos_token_id` and
`forced_eos_token_id` taking precedence and its eos ids added after config.json's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from models.config import _as_id_tuple

GENERATION_CONFIG_NAME = "generation_config.json"
_TOKEN_KEYS = ("decoder_start_token_id", "forced_bos_token_id", "forced_eos_token_id")


def read_generation_config(folder: Path) -> dict[str, Any]:
    path = folder / GENERATION_CONFIG_NAME
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def with_generation_token_ids(
    hf_config: dict[str, Any], generation: dict[str, Any]
) -> dict[str, Any]:
    merged = dict(hf_config)
    for key in _TOKEN_KEYS:
        if generation.get(key) is not None:
            merged[key] = generation[key]
    extra = _as_id_tuple(generation.get("eos_token_id"))
    if extra:
        merged["eos_token_id"] = list(
            dict.fromkeys(_as_id_tuple(hf_config.get("eos_token_id")) + extra)
        )
    return merged
