"""The device the Triton kernels are tested on: CPU tensors through Triton's interpreter
(TRITON_INTERPRET=1, set by tests/conftest.py before triton is imported), or the GPU that
`TGSERVE_TEST_DEVICE` names, where they compile."""

from __future__ import annotations

import os

import pytest
import torch


@pytest.fixture(scope="session")
def triton_kernels() -> torch.device:
    """The device to put the kernels' tensors on."""
    device = torch.device(os.environ.get("TGSERVE_TEST_DEVICE", "cpu"))
    if device.type == "cpu":
        import triton.language as tl
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(tl.zeros, InterpretedFunction):
            raise RuntimeError(
                "triton was imported before TRITON_INTERPRET=1 was set: CPU runs need it set "
                "before the first import of triton (tests/conftest.py does it)"
            )
    return device


@pytest.fixture
def cpu_triton(triton_kernels) -> None:
    """For tests whose model and caches stay on CPU (tests/models/paged_driver.py): they run
    the kernels in the interpreter, so they skip on a GPU run (the engine tests capture there)."""
    if triton_kernels.type != "cpu":
        pytest.skip("model and caches on CPU: Triton runs them interpreted (CPU test runs only)")
