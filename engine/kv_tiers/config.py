"""KVTierConfig: where K/V blocks evicted from the pool go (engine/kv_tiers), and how much.

Contract: frozen, validated on construction (`ValueError` naming the field). `ram_bytes` bounds
the host-memory tier (a CPU engine's "RAM tier"; on a GPU, host memory), `disk_dir` /
`disk_bytes` the directory tier that survives a restart. A disk tier needs a RAM tier (disk
hits are staged there before they are loaded), so `ram_bytes` defaults to
`DEFAULT_RAM_BYTES` when only a directory is given. Pure data: no torch, no file access.
"""

from __future__ import annotations

from dataclasses import dataclass

DEFAULT_RAM_BYTES = 1 << 30  # with a disk dir and no RAM bound: 1 GiB of staging and reuse
DEFAULT_DISK_BYTES = 16 << 30


def _positive_int(name: str, value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive byte count, got {value!r}")


@dataclass(frozen=True)
class KVTierConfig:
    ram_bytes: int | None = None  # None: DEFAULT_RAM_BYTES (see `ram_limit`)
    disk_dir: str | None = None  # None: no disk tier
    disk_bytes: int | None = None  # None: DEFAULT_DISK_BYTES when disk_dir is set

    def __post_init__(self) -> None:
        if self.ram_bytes is not None:
            _positive_int("kv_offload_ram_bytes", self.ram_bytes)
        if self.disk_bytes is not None:
            _positive_int("kv_offload_bytes", self.disk_bytes)
            if self.disk_dir is None:
                raise ValueError("kv_offload_bytes needs kv_offload_dir (the directory it bounds)")
        if self.disk_dir is not None and (not isinstance(self.disk_dir, str) or not self.disk_dir):
            raise ValueError(f"kv_offload_dir must be a directory path, got {self.disk_dir!r}")

    @property
    def ram_limit(self) -> int:
        return self.ram_bytes if self.ram_bytes is not None else DEFAULT_RAM_BYTES

    @property
    def disk_limit(self) -> int:
        return self.disk_bytes if self.disk_bytes is not None else DEFAULT_DISK_BYTES


def kv_tier_config(
    ram_bytes: int | None, disk_dir: str | None, disk_bytes: int | None
) -> KVTierConfig | None:
    """The config the flags ask for, or None when they ask for no tier at all."""
    if ram_bytes is None and disk_dir is None and disk_bytes is None:
        return None
    return KVTierConfig(ram_bytes, disk_dir, disk_bytes)
