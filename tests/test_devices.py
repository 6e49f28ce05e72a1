"""TGSERVE_TEST_DEVICE picks the tests' device: cpu by default, CUDA only where it exists."""

from __future__ import annotations

import pytest
import torch

from tests.devices import ENV, selected_device


def test_default_is_the_cpu(monkeypatch) -> None:
    monkeypatch.delenv(ENV, raising=False)
    assert selected_device() == torch.device("cpu")
    monkeypatch.setenv(ENV, "cpu")
    assert selected_device() == torch.device("cpu")


def test_cuda_is_taken_only_where_it_exists(monkeypatch) -> None:
    monkeypatch.setenv(ENV, "cuda:0")
    if torch.cuda.is_available():
        assert selected_device() == torch.device("cuda:0")
    else:
        with pytest.raises(RuntimeError, match="not available"):
            selected_device()


def test_unknown_devices_are_refused(monkeypatch) -> None:
    monkeypatch.setenv(ENV, "tpu")
    with pytest.raises(ValueError, match="cpu, cuda or cuda:N"):
        selected_device()
