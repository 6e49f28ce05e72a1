"""A backend's memory at load: resident set size before and after, and what it is made of.

Contract: `measure_load(load, source)` runs `load()` (a backend's loader) and returns
`(backend, LoadMemory)`: this process's RSS right before (after handing freed heap pages back,
so what an earlier backend freed does not count) and right after, and the bytes of the model
file's tensors (GGUF only: the header's tensor list; None otherwise). `render(memory, held,
rss_now)` is the report's text: RSS before / after load, the growth split into what the backend
says it holds (`held`: name -> bytes, e.g. tgserve's weights and KV cache) and the rest, the
weights against the file's tensors (issue #15: resident weights ≈ the file's tensor bytes), and
the RSS after the runs (llama.cpp maps its file: its pages become resident as they are first
read, so its growth shows after the runs rather than at load).
RSS is read from /proc/self/statm (Linux); where it cannot be read the text says so. A backend
that runs in another process (tgserve-baseline, tgserve-tp2's second rank) is measured here only
for what this process holds.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TypeVar

from bench.model_source import ModelSource

MIB = 2**20
T = TypeVar("T")


@dataclass(frozen=True)
class LoadMemory:
    rss_before: int | None  # bytes resident in this process right before the load
    rss_after: int | None  # right after it
    file_tensor_bytes: int | None  # the model file's tensors (GGUF), None when unknown


def measure_load(load: Callable[[], T], source: ModelSource) -> tuple[T, LoadMemory]:
    from models.host_memory import release_freed_memory, resident_bytes

    release_freed_memory()
    before = resident_bytes()
    backend = load()
    return backend, LoadMemory(before, resident_bytes(), file_tensor_bytes(source))


def file_tensor_bytes(source: ModelSource) -> int | None:
    if source.gguf_file is None:
        return None
    from models.gguf.header import read_header

    return sum(info.nbytes for info in read_header(source.gguf_file).infos)


def render(memory: LoadMemory, held: Mapping[str, int], rss_now: int | None) -> str:
    parts = []
    weights = held.get("weights")
    if weights is not None and memory.file_tensor_bytes:
        parts.append(
            f"weights {weights / MIB:.0f} MiB = {weights / memory.file_tensor_bytes:.2f}x the "
            f"file's tensors ({memory.file_tensor_bytes / MIB:.0f} MiB)"
        )
    before, after = memory.rss_before, memory.rss_after
    if before is None or after is None:
        return "; ".join([*parts, "RSS not readable here"])
    growth = after - before
    split = [f"{name} {size / MIB:.0f}" for name, size in held.items()]
    if split:
        split.append(f"other {(growth - sum(held.values())) / MIB:.0f}")
    shown = f" = {' + '.join(split)}" if split else ""
    text = (
        f"RSS before load {before / MIB:.0f} MiB, after load {after / MIB:.0f} MiB "
        f"(+{growth / MIB:.0f}{shown})"
    )
    if rss_now is not None:
        text += f", after the runs {rss_now / MIB:.0f} MiB"
    return "; ".join([*parts, text])
