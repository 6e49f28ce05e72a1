"""Reading a GGUF file: its metadata and its tensors, dequantised to torch.

Contract: `open_gguf(path)` parses the header (little-endian GGUF v2/v3) into a `GGUFFile` or
raises `FileNotFoundError` / `ValueError` naming the file. `GGUFFile.tensor(info)` returns the
tensor in row-major order (for a linear layer `[out_features, in_features]`, the Hugging Face
order), keeping F32/F16/BF16 in their own dtype and dequantising Q8_0/Q4_0/Q4_1 to float32 with
`gguf.quants.dequantize` (checked against the GGML block formats in tests/models/test_gguf.py).
Any other tensor type raises `ValueError` naming the file, the tensor and the type. Names stay
GGUF names here; models/gguf/names.py maps them to Hugging Face names.

Why not `gguf.GGUFReader`: it builds numpy views for each of the ~98k vocabulary and merge
strings and takes ~5 s to open SmolLM2 on 2 cores; this header walk skips long arrays (keeping
their length) and opens the same file in tens of milliseconds. Tests check it against GGUFReader.
"""

from __future__ import annotations

import mmap
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType
from gguf.quants import dequantize

# Stored as-is: a plain reinterpretation of the bytes, no arithmetic.
_NATIVE_TYPES = {
    GGMLQuantizationType.F32: (np.float32, torch.float32),
    GGMLQuantizationType.F16: (np.float16, torch.float16),
    GGMLQuantizationType.BF16: (np.int16, torch.bfloat16),  # numpy has no bfloat16: bit-cast
}
# Block-quantised: dequantised to float32.
_QUANTISED_TYPES = (GGMLQuantizationType.Q8_0, GGMLQuantizationType.Q4_0, GGMLQuantizationType.Q4_1)
SUPPORTED_TENSOR_TYPES: tuple[str, ...] = tuple(t.name for t in (*_NATIVE_TYPES, *_QUANTISED_TYPES))

# GGUF value type id -> struct format (8 = string, 9 = array are handled apart).
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
# Arrays longer than this (vocabulary, merges, token types) are skipped, only their length kept.
_MAX_ARRAY_LEN = 64


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    type_id: int  # GGML type id (GGMLQuantizationType value)
    shape: tuple[int, ...]  # row-major (numpy) order: GGUF's dims reversed
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFFile:
    path: Path
    metadata: dict[str, Any]  # GGUF key -> scalar or short list (long arrays left out)
    array_lengths: dict[str, int]  # GGUF key -> element count, for every array field
    infos: tuple[GGUFTensorInfo, ...]  # in file order

    @property
    def architecture(self) -> str:
        return str(self.metadata.get("general.architecture", ""))

    @property
    def tensor_names(self) -> frozenset[str]:
        return frozenset(i.name for i in self.infos)

    def info(self, name: str) -> GGUFTensorInfo | None:
        return next((i for i in self.infos if i.name == name), None)

    def check_types(self) -> None:
        """Raises before any work is done if a tensor has a type we cannot read."""
        for info in self.infos:
            self._check_type(info)

    def tensor(self, info: GGUFTensorInfo) -> torch.Tensor:
        """One tensor, row-major shape, dequantised if needed; owns its memory."""
        qtype = self._check_type(info)
        raw = np.fromfile(self.path, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        if len(raw) != info.nbytes:
            raise ValueError(f"{self.path}: tensor {info.name!r} runs past the end of the file")
        if qtype in _NATIVE_TYPES:
            np_dtype, torch_dtype = _NATIVE_TYPES[qtype]
            values = torch.from_numpy(raw.view(np_dtype).reshape(info.shape))
            return values.view(torch_dtype)
        # dequantize wants [..., bytes per row] and returns float32 [..., elements per row].
        blocks = raw.reshape(*info.shape[:-1], -1)
        return torch.from_numpy(np.ascontiguousarray(dequantize(blocks, qtype), dtype=np.float32))

    def tensors(self) -> Iterator[tuple[str, torch.Tensor]]:
        for info in self.infos:
            yield info.name, self.tensor(info)

    def _check_type(self, info: GGUFTensorInfo) -> GGMLQuantizationType:
        try:
            qtype = GGMLQuantizationType(info.type_id)
        except ValueError:
            qtype = None
        if qtype not in _NATIVE_TYPES and qtype not in _QUANTISED_TYPES:
            shown = qtype.name if qtype is not None else f"id {info.type_id}"
            raise ValueError(
                f"{self.path}: tensor {info.name!r} has GGML type {shown}, which tgserve does not "
                f"read; supported types: {', '.join(SUPPORTED_TENSOR_TYPES)}. Re-quantise the model "
                "to one of them (e.g. with llama.cpp's llama-quantize ... Q8_0)."
            )
        return qtype


def open_gguf(path: str | Path) -> GGUFFile:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (it starts with {bytes(buf[:4])!r})")
        try:
            return _parse(path, buf)
        except (struct.error, UnicodeDecodeError, KeyError, IndexError) as exc:
            raise ValueError(f"{path}: corrupt or truncated GGUF header ({exc!r})") from exc


def _parse(path: Path, buf: mmap.mmap) -> GGUFFile:
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (little-endian v2/v3)")
    reader = _Cursor(buf, 24)
    metadata: dict[str, Any] = {}
    array_lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = reader.string()
        kind = reader.unpack("I")
        if kind == 9:
            item_kind, count = reader.unpack("I"), reader.unpack("Q")
            array_lengths[key] = count
            if count > _MAX_ARRAY_LEN:
                reader.skip_array(item_kind, count)
                continue
            metadata[key] = [reader.value(item_kind) for _ in range(count)]
        else:
            metadata[key] = reader.value(kind)
    raw_infos = []
    for _ in range(n_tensors):
        name = reader.string()
        dims = [reader.unpack("Q") for _ in range(reader.unpack("I"))]
        raw_infos.append((name, dims, reader.unpack("I"), reader.unpack("Q")))
    alignment = int(metadata.get("general.alignment", 32))
    data_start = -(-reader.pos // alignment) * alignment
    infos = []
    for name, dims, type_id, offset in raw_infos:
        shape = tuple(int(d) for d in reversed(dims))
        block, type_size = GGML_QUANT_SIZES.get(_qtype_or_none(type_id), (1, 0))
        elements = int(np.prod(shape)) if shape else 1
        infos.append(
            GGUFTensorInfo(name, type_id, shape, data_start + offset, elements // block * type_size)
        )
    return GGUFFile(path, metadata, array_lengths, tuple(infos))


def _qtype_or_none(type_id: int) -> GGMLQuantizationType | None:
    try:
        return GGMLQuantizationType(type_id)
    except ValueError:
        return None


class _Cursor:
    """Sequential little-endian reads over the memory-mapped header."""

    def __init__(self, buf: mmap.mmap, pos: int) -> None:
        self.buf, self.pos = buf, pos

    def unpack(self, fmt: str) -> Any:
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize("<" + fmt)
        return value

    def string(self) -> str:
        length = self.unpack("Q")
        start, self.pos = self.pos, self.pos + length
        return self.buf[start : self.pos].decode("utf-8")

    def value(self, kind: int) -> Any:
        if kind == 8:
            return self.string()
        if kind == 9:
            item_kind, count = self.unpack("I"), self.unpack("Q")
            return [self.value(item_kind) for _ in range(count)]
        return self.unpack(_SCALARS[kind])

    def skip_array(self, kind: int, count: int) -> None:
        if kind in _SCALARS:
            self.pos += count * struct.calcsize("<" + _SCALARS[kind])
        elif kind == 8:
            for _ in range(count):  # strings: only their lengths are read
                (length,) = struct.unpack_from("<Q", self.buf, self.pos)
                self.pos += 8 + length
        else:
            for _ in range(count):
                self.value(kind)
