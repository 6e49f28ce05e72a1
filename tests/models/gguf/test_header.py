"""The one GGUF header reader (models/gguf/header.py) against the gguf package's GGUFReader: the
tensor reader's walk (long arrays skipped, their length kept) and the tokenizer's full metadata
(every value type)."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch

from models.gguf.file import open_gguf
from models.gguf.header import read_gguf_metadata
from tests.models.gguf.tiny_gguf import tiny_model, to_gguf


def test_header_parse_agrees_with_gguf_reader(tmp_path):
    model, meta = tiny_model("qwen2", tied=False)
    meta["general.name"] = "tiny qwen"
    tokens = [f"tok{i}" for i in range(100)]  # longer than what metadata keeps, so skipped
    path = to_gguf(model, tmp_path / "h.gguf", "qwen2", False, meta, tokens=tokens)
    ours, reader = open_gguf(path), gguf.GGUFReader(path)
    assert ours.array_lengths["tokenizer.ggml.tokens"] == len(tokens)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "tokenizer.ggml.tokens":
            continue
        value = field.contents()
        assert ours.metadata[key] == (value.item() if isinstance(value, np.generic) else value), key
    assert [i.name for i in ours.infos] == [t.name for t in reader.tensors]
    for info, rec in zip(ours.infos, reader.tensors, strict=True):
        assert info.type_id == rec.tensor_type and info.nbytes == rec.n_bytes
        assert torch.equal(ours.tensor(info), torch.from_numpy(np.array(rec.data))), info.name


def test_gguf_header_reader_matches_gguf_package(tmp_path):
    path = tmp_path / "kv.gguf"
    writer = gguf.GGUFWriter(str(path), "llama")
    values = {
        "t.u8": (7, gguf.GGUFValueType.UINT8), "t.i8": (-7, gguf.GGUFValueType.INT8),
        "t.u16": (700, gguf.GGUFValueType.UINT16), "t.i16": (-700, gguf.GGUFValueType.INT16),
        "t.u32": (70000, gguf.GGUFValueType.UINT32), "t.i32": (-70000, gguf.GGUFValueType.INT32),
        "t.f32": (0.1, gguf.GGUFValueType.FLOAT32), "t.bool": (True, gguf.GGUFValueType.BOOL),
        "t.str": ("héllo 😀", gguf.GGUFValueType.STRING), "t.u64": (2**40, gguf.GGUFValueType.UINT64),
        "t.i64": (-(2**40), gguf.GGUFValueType.INT64), "t.f64": (0.1, gguf.GGUFValueType.FLOAT64),
        "t.ints": ([1, -2, 3], gguf.GGUFValueType.ARRAY), "t.strs": (["a", "", "ü"], gguf.GGUFValueType.ARRAY),
        "t.floats": ([0.5, 1.25], gguf.GGUFValueType.ARRAY),
    }  # fmt: skip
    for key, (value, kind) in values.items():
        writer.add_key_value(key, value, kind)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    ours = read_gguf_metadata(path)
    reference = gguf.GGUFReader(path)
    for key in [*values, "general.architecture"]:
        assert ours[key] == pytest.approx(reference.fields[key].contents()), key
