"""Fixtures shared by the test packages: the tiny model folder (server, deploy) and the device
the model / attention / engine / fidelity tests run on (`TGSERVE_TEST_DEVICE`, tests/devices.py)."""

from __future__ import annotations

import pytest

from tests.server.tiny_model import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory):
    """A tiny random Llama + trained BPE tokenizer folder, made once per session."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.fixture(scope="session")
def device():
    """`torch.device` from TGSERVE_TEST_DEVICE (default cpu); see tests/devices.py."""
    from tests.devices import selected_device  # torch only for the tests that ask

    return selected_device()
