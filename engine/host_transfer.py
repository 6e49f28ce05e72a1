"""The two doors between the host and the device in the engine's hot path.

Contract:
- `to_device(values, dtype, device)`: a host list (or host tensor) as a tensor on `device`
  without waiting for the device: on CUDA the values are staged in page-locked memory and
  copied with `non_blocking=True` (a copy from pageable memory, e.g. `torch.tensor(list,
  device="cuda")`, makes the host wait for the stream). On CPU it is a plain tensor.
- `fetch(*tensors)`: THE device-to-host copy of a step: every tensor is copied into
  page-locked memory asynchronously, then the host waits once (one stream synchronisation)
  and gets Python lists back. The sampler calls it once per step, for the sampled ids (and,
  when a row asked for logprobs, their values in the same wait).
Everything else in the step's hot path (engine/model_runner.py, engine/cuda_graphs/,
engine/sampling/) keeps its data on the device: no `.item()`, `.tolist()`, `.cpu()`,
`bool(tensor)` or data-dependent shapes there; tests/engine/test_host_syncs.py checks it on CPU
by recording what reads tensor data back to the host outside `fetch`. So host-side preparation
works on Python lists and numpy arrays, and torch tensors in the hot path live on the device.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def to_device(
    values: Sequence[Any] | Any, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """`values`: a list, a numpy array or a host tensor."""
    if device.type == "cpu":
        return torch.as_tensor(values, dtype=dtype)
    if device.type != "cuda":
        # Built on the host, then moved by `.to`: an op the dispatcher sees, so the
        # device-placement tests (tests/engine/device_placement.py) can follow its values.
        return torch.as_tensor(values, dtype=dtype).to(device)
    host = torch.as_tensor(values, dtype=dtype)
    # The caching host allocator keeps the staging memory alive until the copy has run.
    return host.pin_memory().to(device, non_blocking=True)


def fetch(*tensors: torch.Tensor) -> list[Any]:
    """`[t.tolist() for t in tensors]`, with one wait for the device in all."""
    if not tensors or all(t.device.type == "cpu" for t in tensors):
        return [_host_list(t) for t in tensors]
    staged = []
    for t in tensors:
        host = torch.empty(t.shape, dtype=t.dtype, pin_memory=t.device.type == "cuda")
        host.copy_(t, non_blocking=True)
        staged.append(host)
    if any(t.device.type == "cuda" for t in tensors):
        torch.cuda.current_stream(tensors[0].device).synchronize()
    return [_host_list(t) for t in staged]


def _host_list(t: torch.Tensor) -> Any:
    return t.tolist()
