"""A converted copy of a GGUF file: a Hugging Face folder (config.json + model.safetensors).

Why: opening a GGUF with the `gguf` reader parses every vocabulary string (~5 s for SmolLM2's
49k tokens on 2 cores) and dequantising takes ~2 s more; memory-mapping a converted safetensors
file takes a fraction of a second. So the first load converts, later loads read the folder.

Contract:
- `cache_root(cache_dir)`: the argument if given, else `$TGSERVE_CACHE_DIR`, else
  `$XDG_CACHE_HOME/tgserve`, else `~/.cache/tgserve` (environment read at call time).
- `cache_folder_for(gguf_path, cache_dir)`: `<root>/<stem>-<hash>`, the hash covering the
  resolved path, size and modification time of the GGUF and the conversion format version, so
  a changed file gets a fresh folder.
- `write_cache_folder(folder, hf_config, tensors)` writes into a temporary sibling then renames
  it into place, so a reader never sees half a folder; if another process won the race its folder
  is kept. `is_complete(folder)` says whether a folder can be loaded.
Tensors are stored as loaded (dequantised float32 for quantised types), so the cached folder
loads to exactly the tensors the GGUF gives.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

# Bump when the conversion's output changes, so old folders are not reused.
CACHE_FORMAT_VERSION = 1
CONFIG_NAME = "config.json"
WEIGHTS_NAME = "model.safetensors"


def cache_root(cache_dir: str | Path | None = None) -> Path:
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    env = os.environ.get("TGSERVE_CACHE_DIR")
    if env:
        return Path(env).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "tgserve"


def cache_folder_for(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    path = Path(gguf_path).resolve()
    stat = path.stat()
    key = f"{CACHE_FORMAT_VERSION}|{path}|{stat.st_size}|{stat.st_mtime_ns}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    return cache_root(cache_dir) / f"{path.stem}-{digest}"


def is_complete(folder: Path) -> bool:
    return (folder / CONFIG_NAME).is_file() and (folder / WEIGHTS_NAME).is_file()


def write_cache_folder(
    folder: Path, hf_config: dict[str, Any], tensors: dict[str, torch.Tensor]
) -> None:
    """Writes atomically; raises OSError if the cache location is not writable."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", suffix=".tmp", dir=folder.parent))
    try:
        (tmp / CONFIG_NAME).write_text(json.dumps(hf_config, indent=2, sort_keys=True) + "\n")
        save_file(
            {name: t.contiguous() for name, t in tensors.items()},
            str(tmp / WEIGHTS_NAME),
            metadata={"format": "pt", "tgserve_cache_version": str(CACHE_FORMAT_VERSION)},
        )
        if folder.exists() and not is_complete(folder):
            shutil.rmtree(folder)  # a damaged folder (not one of ours: ours appear whole)
        try:
            os.rename(tmp, folder)
        except OSError:
            if not is_complete(folder):
                raise
            # Another process finished the same conversion first: keep theirs.
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
