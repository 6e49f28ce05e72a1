"""LoraAdapters: the LoRA adapters an engine serves by name, which of them hold a slot of the
runner's bank, and which requests use them (pure bookkeeping; the runner loads the weights).

Contract:
- `register(name, path)` makes `name` servable (weights read and checked now, so a bad folder
  fails here, with the reason); `unregister(name)` forgets it, refused (`AdapterInUse`) while a
  request uses it. Names are unique and never the base model's.
- `admit(request, add)` (the engine queueing a request of `params.adapter`) gives the request
  its adapter's slot (`request.lora_slot`) and prefix-cache key (`request.lora_key`), loading the
  adapter into a slot first if it holds none: a free one, else the least recently used slot
  that no request in flight uses (LRU: a slot is never taken from under a running or waiting
  request), then calls `add(request)`. With every slot in use it raises `AdapterSlotsBusy` (the
  server's 429). A request holds its adapter until it is finished (ended, aborted or failed:
  `Request.is_finished`, read when a slot or an unload is wanted), so the engine never has to
  say when one ends.
- `known(name)`: for request validation. Every method is thread-safe (one lock): `register` /
  `unregister` come from the server's threads, `admit` from the engine's; the weights are only
  written by `admit`, on the engine's thread, between steps.
- An adapter's key is its name and a digest of its files' bytes (`name#digest`): K/V cached
  under an adapter unloaded and loaded again with other weights is never reused, while the same
  weights loaded again, or by the next process (the disk K/V tier's keys carry the key), hit.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from engine.errors import InvalidRequest, QueueFullError
from engine.requests.request import Request, RequestStatus


class AdapterInUse(ValueError):
    """Unloading an adapter that requests in flight use."""


class AdapterSlotsBusy(QueueFullError):
    """Every adapter slot is held by an adapter a request in flight uses."""


@dataclass
class _Adapter:
    path: str
    key: str
    slot: int | None = None  # its bank slot while loaded
    users: list[Request] = field(default_factory=list)  # requests admitted under it

    def in_use(self) -> bool:
        self.users = [r for r in self.users if not _ended(r)]
        return bool(self.users)


def _ended(request: Request) -> bool:
    return request.is_finished or request.status is RequestStatus.FINISHED


class LoraAdapters:
    def __init__(
        self,
        slots: int,
        load: Callable[[int, str, str], None],
        check: Callable[[str, str], None],
    ) -> None:
        """`load(slot, name, path)` writes the adapter into the bank's slot; `check(name,
        path)` reads and validates it without loading (LoraRefused, a ValueError, says why)."""
        self.slots = slots
        self._load, self._check = load, check
        self._adapters: dict[str, _Adapter] = {}
        self._resident: OrderedDict[int, str] = OrderedDict()  # slot -> name, LRU first
        self._lock = threading.Lock()

    @classmethod
    def for_runner(cls, runner: object) -> LoraAdapters:
        """The runner's bank (`lora_slots`, `load_adapter`, `check_adapter`); 0 slots: none."""
        slots = getattr(runner, "lora_slots", 0)
        if not slots:
            return cls(0, _no_bank, _no_bank)
        return cls(slots, runner.load_adapter, runner.check_adapter)  # type: ignore[attr-defined]

    def names(self) -> list[str]:
        with self._lock:
            return list(self._adapters)

    def paths(self) -> dict[str, str]:
        with self._lock:
            return {name: a.path for name, a in self._adapters.items()}

    def known(self, name: str) -> bool:
        return name in self._adapters

    def register(self, name: str, path: str) -> None:
        if name in self._adapters:
            raise ValueError(f"a LoRA adapter named {name!r} is already loaded")
        self._check(name, path)  # outside the lock: it reads files
        key = f"{name}#{files_digest(path)}"
        with self._lock:
            if name in self._adapters:
                raise ValueError(f"a LoRA adapter named {name!r} is already loaded")
            self._adapters[name] = _Adapter(path=path, key=key)

    def unregister(self, name: str) -> None:
        with self._lock:
            adapter = self._adapters.get(name)
            if adapter is None:
                raise KeyError(name)
            if adapter.in_use():
                raise AdapterInUse(
                    f"LoRA adapter {name!r} is in use by {len(adapter.users)} request(s); "
                    "unload it once they finish"
                )
            if adapter.slot is not None:
                del self._resident[adapter.slot]
            del self._adapters[name]

    def admit(self, request: Request, add: Callable[[Request], None]) -> None:
        name = request.params.adapter
        if name is None:
            return add(request)
        with self._lock:
            self._admit(request, name, add)

    def _admit(self, request: Request, name: str, add: Callable[[Request], None]) -> None:
        adapter = self._adapters.get(name)
        if adapter is None:  # unloaded between validation and queueing
            raise InvalidRequest("adapter", f"the LoRA adapter {name!r} is not loaded")
        if adapter.slot is None:
            adapter.slot = self._free_slot()
            self._load(adapter.slot, name, adapter.path)
        self._resident[adapter.slot] = name
        self._resident.move_to_end(adapter.slot)  # most recently used last
        request.lora_slot, request.lora_key = adapter.slot, adapter.key
        add(request)  # may raise (a full queue): the request then never held the adapter
        adapter.users.append(request)

    def _free_slot(self) -> int:
        taken = set(self._resident)
        for slot in range(self.slots):
            if slot not in taken:
                return slot
        for slot, name in self._resident.items():  # least recently used first
            victim = self._adapters[name]
            if not victim.in_use():
                del self._resident[slot]
                victim.slot = None
                return slot
        raise AdapterSlotsBusy(
            f"all {self.slots} LoRA adapter slots (--max-loras) are in use by requests in "
            "flight; retry shortly"
        )


def _no_bank(*_: object) -> None:
    raise ValueError("LoRA adapters are off: start the server with --lora or --max-loras")


def files_digest(path: str) -> str:
    """BLAKE2b of an adapter's bytes: a GGUF file, or a folder's files (sorted by name)."""
    root = Path(path)
    files = sorted(p for p in root.iterdir() if p.is_file()) if root.is_dir() else [root]
    h = hashlib.blake2b(digest_size=16)
    for file in files:
        h.update(file.name.encode() + b"\x00")
        with file.open("rb") as f:
            while chunk := f.read(1 << 20):
                h.update(chunk)
    return h.hexdigest()
