"""The Triton kernels under test: interpreted on CPU tensors, compiled on a GPU.

`TGSERVE_TEST_DEVICE` (default cpu) names the device the tests run on. On CPU the
`triton_kernels` fixture sets TRITON_INTERPRET=1 and re-imports the kernel modules (Triton
decides at decoration time whether a kernel is interpreted), for one test module at a time;
afterwards the variable is restored and the modules imported again as they were, so no
other test runs with the interpreter on.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator

import pytest
import torch

KERNEL_MODULES = ("models.triton_attention.kv_write", "models.triton_attention.paged_attention")


def device_under_test() -> torch.device:
    return torch.device(os.environ.get("TGSERVE_TEST_DEVICE", "cpu"))


def reload_kernels() -> None:
    for name in KERNEL_MODULES:
        importlib.reload(importlib.import_module(name))


@pytest.fixture(scope="module")
def triton_kernels() -> Iterator[torch.device]:
    """The device to put tensors on, with the kernels importable for it."""
    device = device_under_test()
    patch = pytest.MonkeyPatch()
    if device.type == "cpu":
        patch.setenv("TRITON_INTERPRET", "1")
    reload_kernels()
    yield device
    patch.undo()
    reload_kernels()
