"""The GGUF header: key/value metadata and tensor descriptions, read without the tensor data.

Contract: `read_header(path, max_array_len=SHORT_ARRAY_LEN, tensors=True)` parses the header of
a little-endian GGUF v2/v3 file into a `GGUFHeader`: `metadata` (key -> scalar or list),
`array_lengths` (key -> element count, for every array field) and, when `tensors`, the
`GGUFTensorInfo` of every tensor in file order (row-major shape, absolute offset, byte size).
Arrays longer than `max_array_len` are skipped (only their length kept) unless their key is in
`keep`; `None` keeps them all.
`read_gguf_metadata(path)` is every key/value with every array, tensors left unread (what a
tokenizer needs). Raises `FileNotFoundError` for a missing file and `ValueError` naming the file
for a bad magic, another version, or a corrupt or truncated header.

This is tgserve's one GGUF header parser (the tensor reader in models/gguf/file.py and the
tokenizer's vocabulary in models/tokenizer/ both read through it). Why not `gguf.GGUFReader`: it
builds numpy views for each of the ~98k vocabulary and merge strings and takes ~5 s to open
SmolLM2 on 2 cores; this walk skips long arrays when asked, and reads numeric arrays with one
unpack. Tests check it against GGUFReader.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

# GGUF value type id -> struct format of a scalar (gguf's GGUFValueType); 8 = string, 9 = array.
_SCALARS: dict[int, str] = dict(
    zip((0, 1, 2, 3, 4, 5, 6, 7, 10, 11, 12), "BbHhIif?Qqd", strict=True)
)
_STRING, _ARRAY = 8, 9
_U32, _U64 = struct.Struct("<I"), struct.Struct("<Q")
# Arrays longer than this (vocabulary, merges, token types) are skipped by default.
SHORT_ARRAY_LEN = 64


@dataclass(frozen=True)
class GGUFTensorInfo:
    name: str
    type_id: int  # GGML type id (GGMLQuantizationType value)
    shape: tuple[int, ...]  # row-major (numpy) order: GGUF's dims reversed
    offset: int  # absolute byte offset in the file
    nbytes: int


@dataclass(frozen=True)
class GGUFHeader:
    metadata: dict[str, Any]  # GGUF key -> scalar or list (skipped arrays left out)
    array_lengths: dict[str, int]  # GGUF key -> element count, for every array field
    infos: tuple[GGUFTensorInfo, ...]  # in file order; () when tensors were not read


def read_header(
    path: str | Path,
    max_array_len: int | None = SHORT_ARRAY_LEN,
    tensors: bool = True,
    keep: frozenset[str] = frozenset(),
) -> GGUFHeader:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"GGUF file not found: {path}")
    with path.open("rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        if buf[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file (it starts with {bytes(buf[:4])!r})")
        try:
            return _parse(path, buf, max_array_len, tensors, keep)
        except (struct.error, UnicodeDecodeError, KeyError, IndexError) as exc:
            raise ValueError(f"{path}: corrupt or truncated GGUF header ({exc!r})") from exc


def read_gguf_metadata(path: str | Path) -> dict[str, Any]:
    return read_header(path, max_array_len=None, tensors=False).metadata


def _parse(
    path: Path, buf: mmap.mmap, max_array_len: int | None, tensors: bool, keep: frozenset[str]
) -> GGUFHeader:
    version, n_tensors, n_kv = struct.unpack_from("<IQQ", buf, 4)
    if version not in (2, 3):
        raise ValueError(f"{path}: GGUF version {version} is not supported (little-endian v2/v3)")
    reader = _Cursor(buf, 24)
    metadata: dict[str, Any] = {}
    array_lengths: dict[str, int] = {}
    for _ in range(n_kv):
        key = reader.string()
        kind = reader.u32()
        if kind == _ARRAY:
            item_kind, count = reader.u32(), reader.u64()
            array_lengths[key] = count
            if max_array_len is not None and count > max_array_len and key not in keep:
                reader.skip_array(item_kind, count)
                continue
            metadata[key] = reader.array(item_kind, count)
        else:
            metadata[key] = reader.value(kind)
    if not tensors:
        return GGUFHeader(metadata, array_lengths, ())
    raw_infos = []
    for _ in range(n_tensors):
        name = reader.string()
        dims = [reader.u64() for _ in range(reader.u32())]
        raw_infos.append((name, dims, reader.u32(), reader.u64()))
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
    return GGUFHeader(metadata, array_lengths, tuple(infos))


def _qtype_or_none(type_id: int) -> GGMLQuantizationType | None:
    try:
        return GGMLQuantizationType(type_id)
    except ValueError:
        return None


class _Cursor:
    """Sequential little-endian reads over the memory-mapped header."""

    def __init__(self, buf: mmap.mmap, pos: int) -> None:
        self.buf, self.pos = buf, pos

    def u32(self) -> int:
        (value,) = _U32.unpack_from(self.buf, self.pos)
        self.pos += 4
        return value

    def u64(self) -> int:
        (value,) = _U64.unpack_from(self.buf, self.pos)
        self.pos += 8
        return value

    def string(self) -> str:
        length = self.u64()
        start, self.pos = self.pos, self.pos + length
        return self.buf[start : self.pos].decode("utf-8")

    def value(self, kind: int) -> Any:
        if kind == _STRING:
            return self.string()
        if kind == _ARRAY:
            item_kind, count = self.u32(), self.u64()
            return self.array(item_kind, count)
        fmt = "<" + _SCALARS[kind]
        (value,) = struct.unpack_from(fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return value

    def array(self, kind: int, count: int) -> list[Any]:
        if kind in _SCALARS:  # a numeric array: one unpack for all items
            fmt = f"<{count}{_SCALARS[kind]}"
            values = list(struct.unpack_from(fmt, self.buf, self.pos))
            self.pos += struct.calcsize(fmt)
            return values
        return [self.value(kind) for _ in range(count)]

    def skip_array(self, kind: int, count: int) -> None:
        if kind in _SCALARS:
            self.pos += count * struct.calcsize("<" + _SCALARS[kind])
        elif kind == _STRING:
            for _ in range(count):  # strings: only their lengths are read
                (length,) = _U64.unpack_from(self.buf, self.pos)
                self.pos += 8 + length
        else:
            for _ in range(count):
                self.value(kind)
