"""Running engine code with its tensors on "another device" on a CPU-only machine.

Why: on a GPU, a tensor built on the default device (`torch.tensor(values)`, CPU) that meets the
logits (CUDA) raises "Expected all tensors to be on the same device" (issue 24: every beam step
failed so on CUDA). On CPU both are CPU tensors and nothing fails. Here the "other device" is
`meta`: `OnDevice` wraps a real CPU tensor (so values, `.tolist()` and random draws are real) but
reports `device == meta`; `DevicePlacementMode`, a dispatch mode active while the code under
test runs, sees every aten op and raises, as CUDA would, when an op meets a wrapped tensor and a
host tensor of one dimension or more (zero-dim host tensors mix with any device, as in PyTorch).
Ops that move data between devices (`copy_`, `.to`, `.item()`) are allowed to. Factories given
`device=meta` (`torch.empty(..., device=logits.device)`) make wrapped tensors; a *real* meta
tensor (made from host data by a call the mode cannot see, e.g. `torch.tensor(list,
device=...)`) has no values to follow, and the mode says so instead of guessing.

Contract: `on_other_device(t)` wraps `t`; inside `with DevicePlacementMode():` ops on wrapped
tensors compute on their CPU values and return wrapped results; `on_host(t)` unwraps.
Not checked: a generator's device (torch cannot make a meta generator; the code under test
keeps passing CPU generators, which the mode lets draw for meta tensors).
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten, tree_map

OTHER = torch.device("meta")
_aten = torch.ops.aten
# Ops whose job is to move data between devices, or to read it back to the host.
_CROSSING = {
    _aten.copy_.default,
    _aten._to_copy.default,
    _aten._local_scalar_dense.default,
    _aten.is_pinned.default,
    _aten._pin_memory.default,
}


class OnDevice(torch.Tensor):
    """A CPU tensor that says it lives on `OTHER`; its values are `self.host`."""

    host: torch.Tensor

    @staticmethod
    def __new__(cls, host: torch.Tensor) -> OnDevice:
        wrapper = torch.Tensor._make_wrapper_subclass(
            cls,
            host.shape,
            strides=host.stride(),
            storage_offset=host.storage_offset(),
            dtype=host.dtype,
            device=OTHER,
            requires_grad=False,
        )
        wrapper.host = host
        return wrapper

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise RuntimeError(f"{func} on an OnDevice tensor outside DevicePlacementMode")

    def tolist(self) -> Any:  # a device-to-host read, as `.tolist()` of a CUDA tensor
        return self.host.tolist()

    def __repr__(self) -> str:  # torch's repr would print through ops the mode is not in
        return f"OnDevice({self.host!r})"


def on_other_device(t: torch.Tensor) -> OnDevice:
    return OnDevice(t)


def on_host(t: torch.Tensor) -> torch.Tensor:
    return t.host if isinstance(t, OnDevice) else t


class DevicePlacementMode(TorchDispatchMode):
    """Raises on every op that mixes `OTHER` and host tensors; computes the others on the host."""

    def __init__(self) -> None:
        super().__init__()
        self.ops_on_device = 0  # how many ops ran on wrapped tensors (a test can check > 0)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        flat, _ = tree_flatten((args, kwargs))
        tensors = [a for a in flat if isinstance(a, torch.Tensor)]
        wrapped = [t for t in tensors if isinstance(t, OnDevice)]
        if any(t.device.type == "meta" and not isinstance(t, OnDevice) for t in tensors):
            raise AssertionError(
                f"{func} got a real meta tensor: something made a device tensor from host "
                "data in a way the mode cannot follow (use engine.host_transfer.to_device)"
            )
        target = kwargs.get("device")
        to_other = target is not None and torch.device(target) == OTHER
        if not wrapped and not to_other:
            return func(*args, **kwargs)
        self.ops_on_device += 1
        if func not in _CROSSING:
            host = [t for t in tensors if not isinstance(t, OnDevice) and t.dim() > 0]
            if host:
                raise RuntimeError(
                    f"Expected all tensors to be on the same device, but {func} got tensors on "
                    f"{OTHER} and cpu (host shapes {[tuple(t.shape) for t in host]})"
                )
        # An in-place op returns its own argument: give back the caller's object.
        same = {id(t.host): t for t in wrapped}
        same |= {id(t): t for t in tensors if not isinstance(t, OnDevice)}
        host_args, host_kwargs = tree_map(_unwrap, (args, kwargs))
        out = func(*host_args, **host_kwargs)
        back_to_host = target is not None and not to_other
        return tree_map(lambda o: _rewrap(o, same, back_to_host), out)


def _unwrap(a: Any) -> Any:
    if isinstance(a, OnDevice):
        return a.host
    if isinstance(a, torch.device) and a == OTHER:
        return torch.device("cpu")
    return a


def _rewrap(o: Any, same: dict[int, torch.Tensor], back_to_host: bool) -> Any:
    if not isinstance(o, torch.Tensor):
        return o
    if id(o) in same:
        return same[id(o)]
    return o if back_to_host else OnDevice(o)
