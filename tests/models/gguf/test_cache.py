"""The conversion cache (models/gguf/cache.py): a converted folder gives the same tensors without
reading the GGUF again; its location, invalidation, repair and an unwritable location."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from models.loader import load_checkpoint
from tests.models.gguf.tiny_gguf import tiny_model, to_gguf


def _tiny_gguf(tmp_path: Path) -> Path:
    model, meta = tiny_model("llama", tied=True)
    return to_gguf(model, tmp_path / "tiny.gguf", "llama", True, meta)


def test_cached_folder_gives_the_same_tensors_without_reading_the_gguf(tmp_path, monkeypatch):
    path = _tiny_gguf(tmp_path)
    direct_config, direct = load_checkpoint(path, use_cache=False)
    first_config, first = load_checkpoint(path, cache_dir=tmp_path / "cache")
    (folder,) = (tmp_path / "cache").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]

    def no_gguf(_path):
        raise AssertionError("the GGUF was read although a converted folder exists")

    monkeypatch.setattr("models.loader.read_gguf_config", no_gguf)
    cached_config, cached = load_checkpoint(path, cache_dir=tmp_path / "cache")
    assert direct_config == first_config == cached_config
    for name, tensor in direct.items():
        assert torch.equal(first[name], tensor) and torch.equal(cached[name], tensor), name
    assert first.keys() == cached.keys() == direct.keys()


def test_cache_location_comes_from_the_environment_at_call_time(tmp_path, monkeypatch):
    path = _tiny_gguf(tmp_path)
    monkeypatch.setenv("TGSERVE_CACHE_DIR", str(tmp_path / "from-env"))
    load_checkpoint(path)
    assert [p.name.startswith("tiny-") for p in (tmp_path / "from-env").iterdir()] == [True]


def test_a_changed_gguf_is_converted_again(tmp_path):
    path = _tiny_gguf(tmp_path)
    load_checkpoint(path, cache_dir=tmp_path / "c")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    load_checkpoint(path, cache_dir=tmp_path / "c")
    assert len(list((tmp_path / "c").iterdir())) == 2


def test_a_damaged_cache_folder_is_converted_again(tmp_path):
    path = _tiny_gguf(tmp_path)
    _, want = load_checkpoint(path, cache_dir=tmp_path / "c")
    (folder,) = (tmp_path / "c").iterdir()
    (folder / "model.safetensors").write_bytes(b"\x08\x00")  # truncated
    with pytest.warns(UserWarning, match="damaged"):
        _, got = load_checkpoint(path, cache_dir=tmp_path / "c")
    assert all(torch.equal(got[k], v) for k, v in want.items())
    _, again = load_checkpoint(path, cache_dir=tmp_path / "c")  # repaired: no warning now
    assert again.keys() == want.keys()


def test_unwritable_cache_warns_and_still_loads(tmp_path):
    path = _tiny_gguf(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.warns(UserWarning, match="could not cache"):
        _, tensors = load_checkpoint(path, cache_dir=blocker / "cache")
    assert "model.embed_tokens.weight" in tensors
