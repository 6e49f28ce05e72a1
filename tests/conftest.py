"""Fixtures shared by the test packages (server, deploy)."""

from __future__ import annotations

import pytest

from tests.server.tiny_model import make_tiny_model


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory):
    """A tiny random Llama + trained BPE tokenizer folder, made once per session."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny")
