"""Loading weights: a Hugging Face folder or a GGUF file -> (ModelConfig, tensors) -> model.

Contract:
- `load_checkpoint(path)` returns the config and every tensor under transformers' state_dict
  names for LlamaForCausalLM / MistralForCausalLM / Qwen2ForCausalLM / GPT2LMHeadModel (GPT-2
  keeps HF's Conv1D [in, out] layout). `path` is a folder with config.json and model.safetensors
  or a sharded model.safetensors.index.json, or a .gguf file (F32/F16/BF16 kept, Q8_0/Q4_0/Q4_1/
  Q5_0/Q5_1/Q4_K/Q5_K/Q6_K dequantised to float32, llama.cpp's Q/K row permutation undone). With tied embeddings the
  result has no `lm_head.weight`, as in the saved files. Every tensor the config implies is
  checked for presence and shape (gpt-oss's MXFP4 `_blocks` / `_scales` pairs as one lazily
  dequantised entry each: models/gpt_oss/mxfp4.py). A folder's generation_config.json (models/generation_config.py)
  gives the config its token ids and is kept on `ModelConfig.generation`.
- A GGUF file is converted once into a cache folder (models/gguf/cache.py) and later loads read
  that folder; `cache_dir` overrides the location, `use_cache=False` skips it. If the cache is not
  writable the GGUF is still loaded (with a warning).
- `load_model(path, dtype, device, progress)` builds the model (`models.build_model`) and copies
  the tensors in; dtype is "float32" | "bfloat16" | "float16" (float16 only on CUDA). A GGUF's
  block-quantised matrices (`STORED_TYPES`) are kept as stored (models/gguf/stored.py: Llama family on a CPU
  with the C++ kernels) unless `dequantize=True`; otherwise they are dequantised as above. Freed
  heap pages (transient tensors of the load) are handed back before it returns.
Errors: FileNotFoundError for a missing path or shard, ValueError for everything else, each
naming the file (and the tensor when one is at fault).
"""

from __future__ import annotations

import dataclasses
import json
import shutil
import sys
import warnings
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError, safe_open
from tqdm import tqdm

from models.checkpoint_shapes import check_checkpoint
from models.config import ModelConfig
from models.generation_config import read_generation_config, with_generation_token_ids
from models.gguf.cache import (
    CONFIG_NAME,
    WEIGHTS_NAME,
    cache_folder_for,
    is_complete,
    write_cache_folder,
)
from models.gguf.config import read_gguf_config
from models.gguf.names import gguf_to_hf_tensors
from models.host_memory import release_freed_memory

INDEX_NAME = "model.safetensors.index.json"
# The dtypes weights load in, by the name configs and the CLI use.
TORCH_DTYPE_BY_NAME: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "bfloat16": torch.bfloat16,
    "float16": torch.float16,
}
_GPT2_TOP_LEVEL = ("wte.", "wpe.", "h.", "ln_f.")

Tensors = dict[str, torch.Tensor]


def load_checkpoint(
    path: str | Path,
    *,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    progress: bool = False,
) -> tuple[ModelConfig, Tensors]:
    path = Path(path).expanduser()
    if not path.exists():
        raise FileNotFoundError(f"model path not found: {path}")
    if path.is_dir():
        return _load_hf_folder(path)
    if _is_gguf(path):
        config, tensors = (
            _load_gguf_cached(path, cache_dir, progress)
            if use_cache
            else _load_gguf(path, progress)[1:]
        )
        return config, _canonical_names(config, tensors)
    if path.suffix == ".safetensors" or path.name == INDEX_NAME:
        return _load_hf_folder(path.parent)
    raise ValueError(
        f"{path}: not a model; pass a folder holding config.json and model.safetensors "
        "(or model.safetensors.index.json), or a .gguf file"
    )


def load_model(
    path: str | Path,
    dtype: str | torch.dtype = "float32",
    device: str | torch.device = "cpu",
    progress: bool = False,
    *,
    cache_dir: str | Path | None = None,
    use_cache: bool = True,
    dequantize: bool = False,
) -> tuple[torch.nn.Module, ModelConfig]:
    from models import build_model  # models/__init__ imports the model classes

    torch_dtype = torch_dtype_for(dtype, device)
    path = Path(path).expanduser()
    if not dequantize and path.is_file() and _is_gguf(path):
        from models.gguf.stored import load_stored_gguf

        loaded = load_stored_gguf(path, torch_dtype, device)
        if loaded is not None:
            return loaded
    config, tensors = load_checkpoint(
        path, cache_dir=cache_dir, use_cache=use_cache, progress=progress
    )
    model = build_model(config, torch_dtype, device)
    # Hand tensors over one by one and drop our reference, so the float32 copies are freed as the
    # (possibly smaller) parameters fill up.
    names = list(tensors)
    stream = ((name, tensors.pop(name)) for name in names)
    bar = tqdm(
        stream,
        total=len(names),
        desc="loading weights",
        unit="tensor",
        file=sys.stderr,
        disable=not progress,
    )
    with torch.no_grad():
        model.load_weights(bar)
    bar.close()
    release_freed_memory()  # the float32 tensors a GGUF was dequantised to
    return model, config


def torch_dtype_for(dtype: str | torch.dtype, device: str | torch.device) -> torch.dtype:
    """The torch dtype to load weights in on `device`, from a name in TORCH_DTYPE_BY_NAME or a
    torch dtype; ValueError for one we do not load (float16 only on CUDA)."""
    if isinstance(dtype, torch.dtype):
        name = next((k for k, v in TORCH_DTYPE_BY_NAME.items() if v == dtype), str(dtype))
    else:
        name = dtype
    if name not in TORCH_DTYPE_BY_NAME:
        choices = ", ".join(TORCH_DTYPE_BY_NAME)
        raise ValueError(f"unsupported dtype {dtype!r}; choose one of: {choices}")
    if name == "float16" and torch.device(device).type != "cuda":
        raise ValueError("dtype float16 is only supported on CUDA; on CPU use float32 or bfloat16")
    return TORCH_DTYPE_BY_NAME[name]


def _is_gguf(path: Path) -> bool:
    if path.suffix.lower() == ".gguf":
        return True
    with path.open("rb") as f:
        return f.read(4) == b"GGUF"


def _load_hf_folder(folder: Path) -> tuple[ModelConfig, Tensors]:
    config_file = folder / CONFIG_NAME
    if not config_file.is_file():
        raise FileNotFoundError(
            f"no {CONFIG_NAME} in {folder}; a Hugging Face model folder needs config.json next to "
            "its weights (for a GGUF model pass the .gguf file itself)"
        )
    try:
        hf_config = json.loads(config_file.read_text())
        generation = read_generation_config(folder)
        config = ModelConfig.from_hf_dict(with_generation_token_ids(hf_config, generation))
        config = dataclasses.replace(config, generation=generation)
    except (ValueError, KeyError) as exc:
        raise ValueError(f"{config_file}: {exc}") from exc
    tensors, origin = _read_safetensors(folder)
    tensors = _canonical_names(config, tensors)

    def where(name: str | None) -> str:
        return str(origin.get(name, folder)) if name else str(folder)

    check_checkpoint(config, tensors, where)
    return config, tensors


def _read_safetensors(folder: Path) -> tuple[Tensors, dict[str, Path]]:
    single, index = folder / WEIGHTS_NAME, folder / INDEX_NAME
    weight_map: dict[str, str] = {}  # tensor -> shard file, for a sharded checkpoint
    if single.is_file():
        files = [single]
    elif index.is_file():
        weight_map = json.loads(index.read_text()).get("weight_map", {})
        files = [folder / f for f in dict.fromkeys(weight_map.values())]
    else:
        found = ", ".join(sorted(p.name for p in folder.iterdir())) or "nothing"
        raise FileNotFoundError(
            f"no {WEIGHTS_NAME} or {INDEX_NAME} in {folder} (found: {found}); tgserve reads "
            "safetensors only (convert pytorch_model.bin with transformers' save_pretrained)"
        )
    tensors: Tensors = {}
    origin: dict[str, Path] = {}
    for file in files:
        if not file.is_file():
            raise FileNotFoundError(f"{index}: lists shard {file.name}, which is missing")
        try:
            # Memory-mapped: pages are read when load_weights copies them into the model.
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():  # noqa: SIM118 (safe_open is not a mapping)
                    tensors[name] = f.get_tensor(name)
                    origin[name] = file
        except SafetensorError as exc:
            raise ValueError(f"{file}: not a readable safetensors file ({exc})") from exc
    unstored = sorted(weight_map.keys() - tensors.keys())
    if unstored:
        name = unstored[0]
        raise ValueError(f"{index}: tensor {name!r} is listed in {weight_map[name]} but not there")
    return tensors, origin


def _canonical_names(config: ModelConfig, tensors: Tensors) -> Tensors:
    """GPT-2 files saved from GPT2Model (e.g. the original `gpt2`) lack the `transformer.` prefix;
    gpt-oss's released experts are MXFP4 `_blocks` / `_scales` pairs (one entry each here).

    The one place for both: check_checkpoint and the model's load_weights see HF names only.
    """
    if config.family == "gpt_oss":  # pairs dequantised as the model takes them
        from models.gpt_oss.mxfp4 import mxfp4_experts

        return mxfp4_experts(tensors)  # type: ignore[return-value]
    if config.family != "gpt2":
        return tensors
    return {
        ("transformer." + n if n.startswith(_GPT2_TOP_LEVEL) else n): t for n, t in tensors.items()
    }


def _load_gguf(path: Path, progress: bool) -> tuple[dict[str, Any], ModelConfig, Tensors]:
    if progress:
        print(f"reading {path} ...", file=sys.stderr, flush=True)
    gguf, hf_config, config = read_gguf_config(path)
    bar = tqdm(
        total=len(gguf.infos),
        desc="dequantising GGUF",
        unit="tensor",
        file=sys.stderr,
        disable=not progress,
    )
    gguf_names: dict[str, str] = {}
    tensors: Tensors = {}
    for gguf_name, hf_name, tensor in gguf_to_hf_tensors(gguf, hf_config):
        tensors[hf_name] = tensor
        gguf_names[hf_name] = gguf_name
        bar.update()
    bar.close()

    def where(name: str | None) -> str:
        return f"{path} (GGUF tensor {gguf_names[name]!r})" if name in gguf_names else str(path)

    check_checkpoint(config, _canonical_names(config, tensors), where)
    return hf_config, config, tensors


def _load_gguf_cached(
    path: Path, cache_dir: str | Path | None, progress: bool
) -> tuple[ModelConfig, Tensors]:
    folder = cache_folder_for(path, cache_dir)
    if is_complete(folder):
        try:
            return _load_hf_folder(folder)
        except (ValueError, OSError) as exc:
            warnings.warn(
                f"converting {path.name} again: its cached copy is damaged ({exc})", stacklevel=3
            )
            shutil.rmtree(folder, ignore_errors=True)
    hf_config, config, tensors = _load_gguf(path, progress)
    hf_config = hf_config | {"tgserve_converted_from": str(path.resolve())}
    try:
        write_cache_folder(folder, hf_config, tensors)
    except (OSError, SafetensorError) as exc:
        warnings.warn(
            f"could not cache the converted {path.name} in {folder.parent} ({exc}); it will be "
            "converted again next time (set TGSERVE_CACHE_DIR to a writable folder)",
            stacklevel=3,
        )
    return config, tensors
