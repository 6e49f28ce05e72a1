"""Reading a GGUF file: its metadata and its tensors, dequantised to torch.

Contract: `open_gguf(path)` returns a `GGUFFile` (metadata plus raw tensor records) or raises
`FileNotFoundError` / `ValueError` naming the file. `GGUFFile.tensor(record)` returns the tensor
in numpy/row-major order (for a linear layer `[out_features, in_features]`, the Hugging Face
order), keeping F32/F16/BF16 in their own dtype and dequantising Q8_0/Q4_0/Q4_1 to float32 with
`gguf.quants.dequantize` (checked against the GGML block formats in tests/models/test_gguf.py).
Any other tensor type raises `ValueError` naming the file, the tensor and the type. Names stay
GGUF names here; models/gguf_names.py maps them to Hugging Face names.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType
from gguf.gguf_reader import ReaderField, ReaderTensor
from gguf.quants import dequantize

# Stored as-is: a plain reinterpretation of the bytes, no arithmetic.
_NATIVE_TYPES = {
    GGMLQuantizationType.F32: torch.float32,
    GGMLQuantizationType.F16: torch.float16,
    GGMLQuantizationType.BF16: torch.bfloat16,
}
# Block-quantised: dequantised to float32.
_QUANTISED_TYPES = (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1)
SUPPORTED_TENSOR_TYPES: tuple[str, ...] = tuple(t.name for t in (*_NATIVE_TYPES, *_QUANTISED_TYPES))

# Arrays longer than this (the vocabulary, merges, token types) are kept out of `metadata`:
# decoding 49k strings is slow and the weights loader only needs their length.
_MAX_ARRAY_LEN = 64


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]  # GGUF key -> scalar or short list (long arrays left out)
    array_lengths: dict[str, int]  # GGUF key -> element count, for every array field
    records: tuple[ReaderTensor, ...]  # tensor records in file order; data is memory-mapped

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def tensor_names(self) -> frozenset[str]:
        return frozenset(r.name for r in self.records)

    def record(self, name: str) -> ReaderTensor | None:
        return next((r for r in self.records if r.name == name), None)

    def check_types(self) -> None:
        """Raises before any work is done if a tensor has a type we cannot read."""
        for rec in self.records:
            self._check_type(rec)

    def tensor(self, rec: ReaderTensor) -> torch.Tensor:
        """The tensor of one record, numpy (row-major) shape, dequantised if needed."""
        qtype = self._check_type(rec)
        if qtype in _NATIVE_TYPES:
            return _native_tensor(rec, _NATIVE_TYPES[qtype])
        values = dequantize(np.asarray(rec.data), qtype)  # float32, row-major shape
        return torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for rec in self.records:
            yield rec.name, self.tensor(rec)

    def _check_type(self, rec: ReaderTensor) -> GGMLQuantizationType:
        qtype = GGMLQuantizationType(rec.tensor_type)
        if qtype not in _NATIVE_TYPES and qtype not in _QUANTISED_TYPES:
            raise ValueError(
                f"{self.path}: tensor {rec.name!r} has GGML type {qtype.name}, which tgserve does not "
                f"read; supported types: {', '.join(SUPPORTED_TENSOR_TYPES)}. Re-quantise the model "
                "to one of them (e.g. llama.cpp's llama-quantize ... Q8_0)."
            )
        return qtype


def _native_tensor(rec: ReaderTensor, dtype: torch.dtype) -> torch.Tensor:
    data = np.asarray(rec.data)
    if dtype == torch.bfloat16:
        # The reader exposes BF16 as raw bytes [..., 2 * n]: reinterpret as 16-bit words.
        shape = (*data.shape[:-1], data.shape[-1] // 2)
        words = np.ascontiguousarray(data).view(np.int16).reshape(shape)
        return torch.from_numpy(words.copy()).view(torch.bfloat16)
    # Copy out of the read-only memory map so the tensor owns writable memory.
    return torch.from_numpy(np.array(data, copy=True))


def open_gguf(path: str | Path) -> GGUFFile:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    try:
        reader = GGUFReader(path)
    except (ValueError, OSError, KeyError) as exc:
        raise ValueError(f"{path} is not a readable GGUF file: {exc}") from exc
    metadata: dict[str, Any] = {}
    array_lengths: dict[str, int] = {}
    for key, field in reader.fields.items():
        if field.types and field.types[0] == GGUFValueType.ARRAY:
            array_lengths[key] = len(field.data)
            if len(field.data) > _MAX_ARRAY_LEN:
                continue
        metadata[key] = _field_value(field)
    return GGUFFile(path, metadata, array_lengths, tuple(reader.tensors))


def _field_value(field: ReaderField) -> Any:
    value = field.contents()
    if isinstance(value, np.generic):
        return value.item()
    return value
