"""Which weights a benchmark runs, as every backend needs them: path, architecture, HF folder.

Contract: `resolve_model(path_or_None)` returns a `ModelSource` for a Hugging Face folder or a
GGUF file (None: the default model, SmolLM2-135M-Instruct). `config` is the architecture read
from config.json (or the GGUF metadata); `hf_folder` is a folder transformers and vLLM can load
directly: the folder itself, or for a GGUF the converted copy tgserve's loader keeps in its cache
(made when a backend first asks for it: tgserve and llama.cpp read the GGUF itself, so a
1B-shaped file is not converted to float32 for them), so peers run the very same tensors
tgserve does. `gguf_file` is set only for GGUF inputs (llama.cpp needs it). Torch is imported
only for GGUF inputs (models.gguf reads their header), never by importing this module.
`random:NAME` (bench/random_models.py) is a shape with random weights built in memory by the
backend: `random_weights` holds its config.json dict and `hf_folder` is None (transformers builds
the same seeded weights, bench/backends/hf_random.py; peers that load folders say they cannot
run it).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.random_models import is_random_spec, random_shape

if TYPE_CHECKING:  # the models package imports torch: keep `tgserve --help` fast
    from models.config import ModelConfig


@dataclass(frozen=True)
class ModelSource:
    path: Path  # what the user gave (or the default model)
    name: str  # for the report
    config: ModelConfig
    gguf_file: Path | None  # the original GGUF, when the weights came from one
    random_weights: dict[str, Any] | None = None  # `random:NAME`: the shape, no weights on disk

    @cached_property
    def hf_folder(self) -> Path | None:
        """config.json + safetensors with Hugging Face tensor names (a GGUF: converted once;
        None for `random:` shapes, which have no files)."""
        if self.random_weights is not None:
            return None
        return self.path if self.gguf_file is None else _converted_folder(self.gguf_file)


def resolve_model(path: str | Path | None) -> ModelSource:
    from models.default_model import default_model_path

    if is_random_spec(str(path) if path else None):
        from models.config import ModelConfig

        name, hf_config = random_shape(str(path))
        config = ModelConfig.from_hf_dict(hf_config)
        return ModelSource(Path(str(path)), f"{name} (random weights)", config, None, hf_config)

    model_path = Path(path).expanduser() if path else default_model_path()
    if not model_path.exists():
        raise FileNotFoundError(f"--model {model_path}: no such file or folder")
    if model_path.is_dir():
        return ModelSource(model_path, model_path.name, _read_config(model_path), None)
    with model_path.open("rb") as f:
        if f.read(4) != b"GGUF":
            raise ValueError(f"--model {model_path}: pass a Hugging Face folder or a .gguf file")
    return ModelSource(model_path, model_path.stem, _gguf_config(model_path), model_path)


def _gguf_config(gguf: Path) -> ModelConfig:
    from models.gguf.config import read_gguf_config

    return read_gguf_config(gguf)[2]


def _read_config(folder: Path) -> ModelConfig:
    from models.config import ModelConfig

    config_file = folder / "config.json"
    if not config_file.is_file():
        raise FileNotFoundError(f"{folder}: no config.json; pass a Hugging Face model folder")
    return ModelConfig.from_hf_dict(json.loads(config_file.read_text()))


def _converted_folder(gguf: Path) -> Path:
    from models.gguf.cache import cache_folder_for, is_complete
    from models.loader import load_checkpoint

    folder = cache_folder_for(gguf)
    if not is_complete(folder):
        load_checkpoint(gguf, progress=True)  # converts and writes the cache folder
    if not is_complete(folder):
        raise ValueError(
            f"could not cache the converted {gguf.name} in {folder.parent}; set "
            "TGSERVE_CACHE_DIR to a writable folder so the peers can load the same weights"
        )
    return folder
