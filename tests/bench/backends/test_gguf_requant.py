"""The GGUF rewrite for llama.cpp (bench/backends/gguf_requant.py): tensors equal the GGML block
formats decoded by hand then rounded by torch (what tgserve runs), metadata equal GGUFReader's view
of the source, the cache keyed on the source file and written atomically.
"""

from __future__ import annotations

import os
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as QT

from bench.backends import gguf_requant
from bench.backends.gguf_requant import needs_requant, requantized_gguf, write_requantized
from models.gguf.file import open_gguf
from tests.ggml_blocks import hand_dequantise

ROWS, COLS = 6, 64  # two 32-wide blocks per row


def _source(path: Path) -> tuple[Path, dict[str, np.ndarray]]:
    """A tiny GGUF with every tensor kind; returns it and each tensor's float32 values."""
    gen = np.random.default_rng(0)
    writer = gguf.GGUFWriter(str(path), arch="llama")
    writer.add_block_count(1)
    writer.add_context_length(128)
    writer.add_rope_freq_base(10000.0)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_Q4_1)
    writer.add_tokenizer_model("gpt2")
    writer.add_token_list(["<s>", "a", "bé", "\n"])
    writer.add_token_types([3, 1, 1, 1])
    writer.add_bool("tokenizer.ggml.add_bos_token", False)
    writer.add_chat_template("{% for m in messages %}{{ m['content'] }}{% endfor %}")
    expected = {}
    for name, qtype in [
        ("token_embd.weight", QT.Q8_0),
        ("blk.0.attn_q.weight", QT.Q4_0),
        ("blk.0.ffn_up.weight", QT.Q4_1),
    ]:
        raw = gguf.quants.quantize(gen.standard_normal((ROWS, COLS)).astype(np.float32), qtype)
        writer.add_tensor(name, raw, raw_dtype=qtype)
        expected[name] = hand_dequantise(raw, qtype)
    f16 = gen.standard_normal((ROWS, COLS)).astype(np.float16)
    writer.add_tensor("blk.0.attn_k.weight", f16)
    expected["blk.0.attn_k.weight"] = f16.astype(np.float32)
    norm = (1 + gen.standard_normal(COLS) / 3).astype(np.float32)  # not bf16-representable
    writer.add_tensor("blk.0.attn_norm.weight", norm)
    expected["blk.0.attn_norm.weight"] = norm
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path, expected


def _fields(path: Path) -> dict[str, object]:
    reader = gguf.GGUFReader(path)
    return {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith("GGUF.")}


@pytest.mark.parametrize(
    ("dtype", "qtype", "torch_dtype"),
    [("bfloat16", QT.BF16, torch.bfloat16), ("float32", QT.F32, torch.float32)],
)
def test_rewritten_tensors_are_the_dequantised_values_rounded_to_the_model_dtype(
    tmp_path, dtype, qtype, torch_dtype
):
    source, expected = _source(tmp_path / "q.gguf")
    write_requantized(source, tmp_path / "out.gguf", dtype)
    out = open_gguf(tmp_path / "out.gguf")
    assert [i.name for i in out.infos] == list(expected)
    for info in out.infos:
        want = torch.from_numpy(expected[info.name]).to(torch_dtype)
        got = out.tensor(info)
        if len(info.shape) == 1:  # norms stay F32 for llama.cpp, holding the rounded values
            assert info.type_id == QT.F32
            want = want.float()
        else:
            assert info.type_id == qtype
        assert got.dtype == want.dtype and got.shape == want.shape
        assert torch.equal(got, want), info.name


def test_metadata_is_copied_with_only_the_file_type_changed(tmp_path):
    source, _ = _source(tmp_path / "q.gguf")
    write_requantized(source, tmp_path / "out.gguf", "bfloat16")
    before, after = _fields(source), _fields(tmp_path / "out.gguf")
    assert after.pop("general.file_type") == gguf.LlamaFileType.MOSTLY_BF16
    assert before.pop("general.file_type") == gguf.LlamaFileType.MOSTLY_Q4_1
    assert after == before
    assert after["tokenizer.ggml.tokens"] == ["<s>", "a", "bé", "\n"]


def test_only_files_not_already_in_the_target_type_need_a_rewrite(tmp_path):
    source, _ = _source(tmp_path / "q.gguf")
    assert needs_requant(source, "bfloat16")
    write_requantized(source, tmp_path / "out.gguf", "bfloat16")
    assert not needs_requant(tmp_path / "out.gguf", "bfloat16")
    assert needs_requant(tmp_path / "out.gguf", "float32")


def test_unknown_dtype_is_refused_naming_the_choices(tmp_path):
    source, _ = _source(tmp_path / "q.gguf")
    with pytest.raises(ValueError, match="bfloat16"):
        requantized_gguf(source, "int4", cache_dir=tmp_path / "cache")


def test_cached_copy_is_reused_and_redone_when_the_source_changes(tmp_path, monkeypatch):
    source, _ = _source(tmp_path / "q.gguf")
    cache = tmp_path / "cache"
    first = requantized_gguf(source, "bfloat16", cache_dir=cache)
    assert not needs_requant(first, "bfloat16")
    assert requantized_gguf(source, "float32", cache_dir=cache) != first

    def no_rewrite(*_args):
        raise AssertionError("the cached copy should have been reused")

    monkeypatch.setattr(gguf_requant, "write_requantized", no_rewrite)
    assert requantized_gguf(source, "bfloat16", cache_dir=cache) == first
    monkeypatch.undo()
    stat = source.stat()
    os.utime(source, ns=(stat.st_atime_ns, stat.st_mtime_ns + 10**9))
    second = requantized_gguf(source, "bfloat16", cache_dir=cache)
    assert second != first and second.is_file()
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


def test_a_failed_rewrite_leaves_no_file_behind(tmp_path, monkeypatch):
    source, _ = _source(tmp_path / "q.gguf")
    cache = tmp_path / "cache"

    def half_write(_source, dest, _dtype):
        Path(dest).write_bytes(b"GGUF half")
        raise OSError("disk full")

    monkeypatch.setattr(gguf_requant, "write_requantized", half_write)
    with pytest.raises(OSError, match="disk full"):
        requantized_gguf(source, "bfloat16", cache_dir=cache)
    assert list(cache.iterdir()) == []
