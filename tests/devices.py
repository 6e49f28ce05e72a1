"""The device the model, attention, engine and fidelity tests run on.

`TGSERVE_TEST_DEVICE` (read when a test asks, never at import): `cpu` (the default: CI),
`cuda` or `cuda:N` (a lent GPU: `TGSERVE_TEST_DEVICE=cuda python -m pytest -q tests/models
tests/engine ...`). A CUDA device that is not there is an error, never a silent fallback or
skip. Tests that are CPU-only by nature (the C++ kernels, the host-sync recorder) ignore it.
The `device` fixture of tests/conftest.py returns it.
"""

from __future__ import annotations

import os
import re

import torch

ENV = "TGSERVE_TEST_DEVICE"


def selected_device() -> torch.device:
    name = os.environ.get(ENV, "cpu").strip() or "cpu"
    if name == "cpu":
        return torch.device("cpu")
    if not re.fullmatch(r"cuda(:\d+)?", name):
        raise ValueError(f"{ENV}={name!r}: use cpu, cuda or cuda:N")
    if not torch.cuda.is_available():
        raise RuntimeError(f"{ENV}={name!r} but CUDA is not available on this machine")
    return torch.device(name)


CPU_KERNELS_ONLY = (
    "the C++ kernels are tgserve's CPU path; an engine on CUDA runs PyTorch and Triton "
    "kernels instead (the PyTorch case of this test covers it)"
)


def skip_cpu_kernels_off_cpu(cpu_kernels: bool) -> None:
    """Skips a test case that asks an engine on the tests' device for the C++ CPU kernels
    when that device is not the CPU."""
    import pytest

    if cpu_kernels and selected_device().type != "cpu":
        pytest.skip(CPU_KERNELS_ONLY)
