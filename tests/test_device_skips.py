"""What the tests do off the CPU (a lent GPU machine, `TGSERVE_TEST_DEVICE=cuda`), checked on
the CPU with the device faked: tests of the C++ CPU kernels alone skip with the reason, and a
missing default model skips there (its wheel cannot travel) but stays an error on the CPU."""

from __future__ import annotations

import pytest
import torch

import tests.conftest as conftest
from tests import devices


class _Item:
    def __init__(self, marked: bool) -> None:
        self.marked = marked

    def get_closest_marker(self, name: str) -> object | None:
        return object() if self.marked and name == "cpu_kernels" else None


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_cpu_kernel_tests_skip_off_the_cpu_only(monkeypatch, device) -> None:
    monkeypatch.setattr(devices, "selected_device", lambda: torch.device(device))
    conftest.pytest_runtest_setup(_Item(marked=False))  # unmarked tests run everywhere
    if device == "cpu":
        conftest.pytest_runtest_setup(_Item(marked=True))
    else:
        with pytest.raises(pytest.skip.Exception, match="C\\+\\+ CPU kernels alone"):
            conftest.pytest_runtest_setup(_Item(marked=True))


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_missing_default_model_skips_off_the_cpu_only(monkeypatch, device) -> None:
    import models.default_model

    def missing():
        raise FileNotFoundError("the default model is not installed")

    monkeypatch.setattr(models.default_model, "default_model_path", missing)
    monkeypatch.setattr(devices, "selected_device", lambda: torch.device(device))
    if device == "cpu":
        with pytest.raises(FileNotFoundError):
            devices.default_model_here()
    else:
        with pytest.raises(pytest.skip.Exception, match="cannot travel|64 MiB"):
            devices.default_model_here()
