"""The KV pool's arithmetic, torch-free: how many bytes the cache gets (`kv_cache_budget_bytes`),
what one block of K and V costs (`kv_bytes_per_block`:
2 * num_layers * block_size * num_kv_heads * head_dim * dtype_bytes; a pool row is the model's dtype, or with
`--kv-cache-dtype int8` head_dim int8 values and a 4-byte float32 scale, with fp8 head_dim e4m3
values and the same scale, with float16 a float32 model's values in 2 bytes: `kv_row_layout`; with
int8v K and V differ, float16 K rows and int8 V rows: `kv_pair_bytes` is one (token, KV head)'s K
and V bytes for every layout, `kv_block_bytes` a block's), how many whole blocks fit
(`num_kv_blocks`, `whole_blocks`: a ValueError naming the settings when none does), and
whether the K/V dtype asked for can be served on a device (`kv_cache_dtype_refusal`: a reason, or
None).
"""

from __future__ import annotations

from engine.config import EngineConfig, dtype_bytes


def _is_positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def kv_cache_budget_bytes(config: EngineConfig, free_memory_bytes: int) -> int:
    """Bytes given to the KV cache: the explicit budget, else a fraction of free memory."""
    if config.kv_cache_memory_bytes is not None:
        return config.kv_cache_memory_bytes
    if free_memory_bytes < 0:
        raise ValueError(f"free_memory_bytes must be >= 0, got {free_memory_bytes}")
    return int(free_memory_bytes * config.kv_cache_memory_fraction)


def kv_bytes_per_block(
    num_layers: int, num_kv_heads: int, head_dim: int, dtype_bytes: int, block_size: int
) -> int:
    _check_sizes(
        num_layers=num_layers,
        num_kv_heads=num_kv_heads,
        head_dim=head_dim,
        dtype_bytes=dtype_bytes,
        block_size=block_size,
    )
    return 2 * num_layers * block_size * num_kv_heads * head_dim * dtype_bytes  # K and V


def _check_sizes(**sizes: object) -> None:
    for name, value in sizes.items():
        if not _is_positive_int(value):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")


def kv_row_layout(kv_cache_dtype: str, head_dim: int, dtype: str) -> tuple[int, int]:
    """(elements, bytes per element) of one (token, KV head) row of K or V in the pool: the
    model's dtype, or int8 (e4m3) values plus a float32 scale's 4 bytes (models/kv_quant.py,
    models/kv_fp8.py). "int8v" has two row layouts: ask for each part's ("float16", "int8")."""
    if kv_cache_dtype == "int8v":
        raise ValueError("int8v's K and V rows differ: kv_pair_bytes, or each part's layout")
    if kv_cache_dtype in ("int8", "fp8"):
        return head_dim + 4, 1
    if kv_cache_dtype == "float16":  # a float32 model's rows rounded (models/kv_half.py)
        return head_dim, dtype_bytes("float16")
    return head_dim, dtype_bytes(dtype)


def kv_pair_bytes(kv_cache_dtype: str, head_dim: int, dtype: str) -> int:
    """Bytes of one (token, KV head)'s K row plus its V row: "int8v" float16 K (2 D) and int8
    V rows (D + 4), the others twice their one row."""
    parts = ("float16", "int8") if kv_cache_dtype == "int8v" else (kv_cache_dtype,) * 2
    total = 0
    for part in parts:
        row, element_bytes = kv_row_layout(part, head_dim, dtype)
        total += row * element_bytes
    return total


def kv_block_bytes(
    config: EngineConfig, num_layers: int, num_kv_heads: int, head_dim: int, dtype: str
) -> int:
    """One block's K and V bytes in every layer (kv_bytes_per_block for any layout: the
    config's kv_cache_dtype and block_size)."""
    block_size = config.block_size
    _check_sizes(
        num_layers=num_layers, num_kv_heads=num_kv_heads, head_dim=head_dim, block_size=block_size
    )
    return (
        num_layers
        * block_size
        * num_kv_heads
        * kv_pair_bytes(config.kv_cache_dtype, head_dim, dtype)
    )


def num_kv_blocks(
    budget_bytes: int,
    num_layers: int,
    num_kv_heads: int,
    head_dim: int,
    dtype_bytes: int,
    block_size: int,
) -> int:
    """How many whole KV blocks fit in `budget_bytes` (at least one, else a ValueError)."""
    per_block = kv_bytes_per_block(num_layers, num_kv_heads, head_dim, dtype_bytes, block_size)
    return whole_blocks(budget_bytes, per_block)


def whole_blocks(budget_bytes: int, per_block: int) -> int:
    """How many whole blocks of `per_block` bytes fit (at least one, else a ValueError)."""
    blocks = budget_bytes // per_block if budget_bytes > 0 else 0
    if blocks < 1:
        raise ValueError(
            f"the KV cache budget ({budget_bytes} bytes) holds no block of {per_block} bytes; "
            "raise kv_cache_memory_bytes / kv_cache_memory_fraction or lower block_size"
        )
    return blocks


def kv_cache_dtype_refusal(config: EngineConfig, device_type: str, model_dtype: str) -> str | None:
    """Why `config.kv_cache_dtype` cannot be served on `device` (None: it can). int8 rows are
    read by the C++ paged attention on a CPU; fp8 rows by the Triton paged kernels on CUDA
    (models/forward_path.py refuses a path that cannot read the cache it is given); float16
    rows are a float32 model's (`model_dtype`, resolved) on a CPU, or a float16 model's own."""
    kind = config.kv_cache_dtype
    if kind == "float16":
        return _float16_refusal(device_type, model_dtype)
    if kind == "int8v":  # float16 K rows (a float32 model's), int8 V rows (the C++ attention)
        return _float16_refusal(device_type, model_dtype, kind) or _int8_refusal(config, kind)
    if kind == "int8" and device_type != "cpu":
        return (
            f"--kv-cache-dtype int8 is read by tgserve's C++ CPU attention; on {device_type} "
            "use --kv-cache-dtype auto"
        )
    if kind == "int8":
        return _int8_refusal(config, kind)
    if kind == "fp8" and device_type == "cpu":
        return "--kv-cache-dtype fp8 is for CUDA devices; on a CPU use --kv-cache-dtype int8"
    if kind == "fp8" and device_type != "cuda":
        return (
            f"--kv-cache-dtype fp8 is for CUDA devices; on {device_type} use --kv-cache-dtype auto"
        )
    return None


def _int8_refusal(config: EngineConfig, kind: str) -> str | None:
    if not config.cpu_kernels:
        return (
            f"--kv-cache-dtype {kind} is read by tgserve's C++ paged attention, which "
            "--disable-cpu-kernels turns off: drop one of the two"
        )
    return None


def _float16_refusal(device_type: str, model_dtype: str, kind: str = "float16") -> str | None:
    if model_dtype == "float16" and kind == "float16":  # its cache is float16 already: auto's
        return None
    if model_dtype != "float32":
        return (
            f"--kv-cache-dtype {kind} rounds a float32 model's K to float16; this model runs in "
            f"{model_dtype}: use --kv-cache-dtype auto (or --dtype float32)"
        )
    if device_type != "cpu":  # the Triton kernels read a cache of q's dtype (or fp8 rows)
        return (
            f"--kv-cache-dtype {kind} with a float32 model is read by tgserve's CPU attention; "
            f"on {device_type} use --dtype float16 (its cache is float16) or --kv-cache-dtype auto"
        )
    return None
