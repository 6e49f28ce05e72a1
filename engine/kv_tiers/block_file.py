"""One K/V block in one file: the disk tier's format, written atomically, read suspiciously.

Layout: 8 magic bytes `TGKVBLK1`, a little-endian u32 header length, a UTF-8 JSON header
`{"namespace", "key", "tokens", "shape", "dtype", "checksum"}` (namespace digest and key in hex,
the block's token ids, the payload's shape and torch dtype name, the payload's BLAKE2b-256 hex),
then the payload: the block's K/V, `[num_layers, 2 (K, V), block_size, num_kv_heads, head_dim]`,
C order.

Contract: `write_block_file` writes to a temporary name in the same directory and renames it
over the final name, so a reader sees the old file, the new one or none, never half of one.
`read_block_file` returns the payload only when the magic, every header field (namespace, key,
tokens, shape, dtype) and the checksum match what the caller expects and the file holds
exactly the bytes the header announces; otherwise None and the reason (a truncated, corrupt or
stale file is never served).
"""

from __future__ import annotations

import hashlib
import json
import os
import struct
import threading
from pathlib import Path

import torch

MAGIC = b"TGKVBLK1"
SUFFIX = ".kvb"
_LEN = struct.Struct("<I")
_MAX_HEADER = 1 << 20


def _dtype_name(dtype: torch.dtype) -> str:
    return str(dtype).removeprefix("torch.")


def _checksum(payload: bytes | memoryview) -> str:
    return hashlib.blake2b(payload, digest_size=32).hexdigest()


def encode_block(namespace: bytes, key: int, tokens: tuple[int, ...], kv: torch.Tensor) -> bytes:
    """The file's bytes for `kv` ([layers, 2, block_size, kv_heads, head_dim], on the CPU)."""
    payload = kv.contiguous().view(torch.uint8).numpy().tobytes()
    header = json.dumps(
        {
            "namespace": namespace.hex(),
            "key": f"{key:032x}",
            "tokens": list(tokens),
            "shape": list(kv.shape),
            "dtype": _dtype_name(kv.dtype),
            "checksum": _checksum(payload),
        }
    ).encode()
    return MAGIC + _LEN.pack(len(header)) + header + payload


def write_block_file(path: Path, data: bytes) -> None:
    """Temp file + rename: readers never see a partial file."""
    tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp")
    try:
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def read_block_file(
    path: Path,
    namespace: bytes,
    key: int,
    tokens: tuple[int, ...],
    shape: tuple[int, ...],
    dtype: torch.dtype,
) -> tuple[torch.Tensor | None, str]:
    """(payload, "") when the file holds exactly this block; (None, why) otherwise."""
    try:
        data = path.read_bytes()
    except OSError as exc:
        return None, f"unreadable ({exc.strerror})"
    if data[: len(MAGIC)] != MAGIC or len(data) < len(MAGIC) + _LEN.size:
        return None, "not a K/V block file"
    (header_len,) = _LEN.unpack_from(data, len(MAGIC))
    start = len(MAGIC) + _LEN.size
    if header_len > _MAX_HEADER or len(data) < start + header_len:
        return None, "truncated header"
    try:
        header = json.loads(data[start : start + header_len])
        expected = {
            "namespace": namespace.hex(),
            "key": f"{key:032x}",
            "tokens": list(tokens),
            "shape": list(shape),
            "dtype": _dtype_name(dtype),
        }
        stale = [name for name, value in expected.items() if header.get(name) != value]
    except (ValueError, AttributeError):
        return None, "unreadable header"
    if stale:
        return None, f"stale (other {', '.join(stale)})"
    payload = memoryview(data)[start + header_len :]
    size = torch.empty((), dtype=dtype).element_size()
    for dim in shape:
        size *= dim
    if len(payload) != size:
        return None, f"truncated payload ({len(payload)} of {size} bytes)"
    if _checksum(payload) != header.get("checksum"):
        return None, "checksum mismatch"
    kv = torch.frombuffer(bytearray(payload), dtype=dtype).view(shape)
    return kv, ""
