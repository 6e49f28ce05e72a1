"""A GGUF copy whose weights are the ones tgserve runs: every tensor dequantised to one dtype.

Why: the default model ships as a Q4_1 GGUF; tgserve dequantises it and runs bf16 (or fp32), so
llama.cpp on the original file would run other (4.5-bit) weights. This rewrites the file with the
tensors tgserve holds, so both engines multiply the same numbers.

Contract:
- `needs_requant(gguf_path, dtype)`: whether some 2-D+ tensor is not already stored as `dtype`.
- `write_requantized(source, dest, dtype)` writes `dest`: every metadata field copied as read
  (hparams, tokenizer, chat template...) except `general.file_type`, set to the new type; every
  tensor in file order with the same name and shape, its values the source's dequantised to
  float32 (`gguf.quants.dequantize`) then rounded to `dtype` (round to nearest even, as
  `torch.Tensor.to` does). Tensors of rank 1 (norms, biases) stay F32, as llama.cpp expects, but
  hold the values rounded to `dtype`: tgserve casts its norms to the model dtype too.
- `requantized_gguf(source, dtype, cache_dir=None)` returns the cached copy, writing it first if
  missing: `<cache_root>/<stem>-<dtype>-<hash>.gguf`, the hash covering the source's file name,
  size, modification time and `REQUANT_FORMAT_VERSION`; written to a temporary sibling then
  renamed, so a reader never sees half a file. `cache_root` is models/gguf/cache.py's.
`dtype` is "float32" | "bfloat16" | "float16"; anything else raises ValueError.
"""

from __future__ import annotations

import hashlib
import os
import tempfile
from pathlib import Path

import numpy as np
from gguf import GGMLQuantizationType, GGUFReader, GGUFValueType, GGUFWriter, Keys, LlamaFileType
from gguf.quants import dequantize, quantize

# Bump when the written file changes, so stale copies are not reused.
REQUANT_FORMAT_VERSION = 1

TARGET_TYPES: dict[str, GGMLQuantizationType] = {
    "float32": GGMLQuantizationType.F32,
    "bfloat16": GGMLQuantizationType.BF16,
    "float16": GGMLQuantizationType.F16,
}
_FILE_TYPES = {
    GGMLQuantizationType.F32: LlamaFileType.ALL_F32,
    GGMLQuantizationType.BF16: LlamaFileType.MOSTLY_BF16,
    GGMLQuantizationType.F16: LlamaFileType.MOSTLY_F16,
}


def target_type(dtype: str) -> GGMLQuantizationType:
    if dtype not in TARGET_TYPES:
        raise ValueError(
            f"cannot rewrite a GGUF as {dtype!r}; choose one of: {', '.join(TARGET_TYPES)}"
        )
    return TARGET_TYPES[dtype]


def stored_types(gguf_path: str | Path) -> tuple[str, ...]:
    """The GGML types of the file's matrices (rank >= 2), sorted: e.g. ("Q4_1", "Q8_0")."""
    from models.gguf.file import open_gguf  # header walk only: fast, no vocabulary parsing

    infos = open_gguf(gguf_path).infos
    return tuple(sorted({_type_name(i.type_id) for i in infos if len(i.shape) >= 2}))


def needs_requant(gguf_path: str | Path, dtype: str) -> bool:
    return stored_types(gguf_path) != (target_type(dtype).name,)


def round_to(values: np.ndarray, qtype: GGMLQuantizationType) -> np.ndarray:
    """float32 values -> the array GGUF stores for `qtype` (uint8 bytes for BF16)."""
    if qtype == GGMLQuantizationType.F32:
        return np.ascontiguousarray(values, dtype=np.float32)
    if qtype == GGMLQuantizationType.F16:
        return np.ascontiguousarray(values, dtype=np.float16)
    return quantize(np.ascontiguousarray(values, dtype=np.float32), qtype)


def write_requantized(source: str | Path, dest: str | Path, dtype: str) -> None:
    qtype = target_type(dtype)
    reader = GGUFReader(source)
    arch_field = reader.fields.get(Keys.General.ARCHITECTURE)
    if arch_field is None:
        raise ValueError(f"{source}: no general.architecture field; is it a model GGUF?")
    writer = GGUFWriter(dest, arch=str(arch_field.contents()))
    copy_fields(reader, writer, skip={Keys.General.FILE_TYPE})
    writer.add_file_type(_FILE_TYPES[qtype])
    # Infos first (the header precedes the data), then one tensor converted at a time.
    plans = [_plan(t, qtype) for t in reader.tensors]
    for tensor, (shape, stored_as) in zip(reader.tensors, plans, strict=True):
        itemsize = 4 if stored_as == GGMLQuantizationType.F32 else 2
        nbytes = int(np.prod(shape)) * itemsize
        writer.add_tensor_info(tensor.name, shape, np.dtype(np.float32), nbytes, stored_as)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_ti_data_to_file()
    for tensor, (_, stored_as) in zip(reader.tensors, plans, strict=True):
        writer.write_tensor_data(_convert(tensor.data, tensor.tensor_type, qtype, stored_as))
    writer.close()


def copy_fields(reader: GGUFReader, writer: GGUFWriter, skip: set[str] = frozenset()) -> None:
    """Every metadata field of `reader` as read, into `writer`, but those named in `skip`."""
    for field in reader.fields.values():
        # GGUF.* are the reader's header pseudo-fields; the writer adds the architecture itself.
        if field.name.startswith("GGUF.") or field.name == Keys.General.ARCHITECTURE:
            continue
        if field.name in skip:
            continue
        vtype = field.types[0]
        sub_type = field.types[-1] if vtype == GGUFValueType.ARRAY else None
        writer.add_key_value(field.name, field.contents(), vtype, sub_type=sub_type)


def requantized_gguf(source: str | Path, dtype: str, cache_dir: str | Path | None = None) -> Path:
    from models.gguf.cache import cache_root

    source = Path(source)
    target_type(dtype)
    stat = source.stat()
    key = f"{REQUANT_FORMAT_VERSION}|{source.name}|{stat.st_size}|{stat.st_mtime_ns}|{dtype}"
    digest = hashlib.sha256(key.encode()).hexdigest()[:16]
    dest = cache_root(cache_dir) / f"{source.stem}-{dtype}-{digest}.gguf"
    if dest.is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".tmp", dir=dest.parent)
    os.close(fd)
    try:
        write_requantized(source, tmp_name, dtype)
        os.replace(tmp_name, dest)  # atomic: a concurrent writer's identical file is replaced
    finally:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
    return dest


def _plan(tensor, qtype: GGMLQuantizationType) -> tuple[tuple[int, ...], GGMLQuantizationType]:
    """(row-major element shape, type to store) for one GGUFReader tensor."""
    shape = tuple(int(d) for d in reversed(tensor.shape))  # GGUF lists dims innermost first
    return shape, qtype if len(shape) >= 2 else GGMLQuantizationType.F32


def _convert(
    data: np.ndarray,
    stored: GGMLQuantizationType,
    qtype: GGMLQuantizationType,
    stored_as: GGMLQuantizationType,
) -> np.ndarray:
    """The bytes to write for one tensor as GGUFReader gives it (raw blocks for quantised types)."""
    values = dequantize(data, GGMLQuantizationType(stored))  # float32 [..., cols]
    rounded = round_to(values, qtype)
    if stored_as == qtype:
        return rounded
    # Rank 1 kept F32 for llama.cpp, holding the values the model dtype gives them.
    return np.ascontiguousarray(dequantize(rounded, qtype), dtype=np.float32)


def _type_name(type_id: int) -> str:
    try:
        return GGMLQuantizationType(type_id).name
    except ValueError:
        return f"type {type_id}"
