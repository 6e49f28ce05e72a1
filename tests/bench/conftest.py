"""Tiny random GGUFs (bench/random_gguf.py) for the bench tests, written once per session.

`write_random_gguf` copies the default model's vocabulary (49,152 tokens and their merges), and
gguf-py's `GGUFReader` parses such a file field by field in Python: 4-15 s a read on a 2-core
host, ten reads in these tests before they shared them. Here the default model's file is read
once per session (`default_vocab_reader`; the writer gets that reader back when it asks for the
default model's file, any other path is read afresh), and the Q4_1 file of the `TINY` shape
that three tests load is written once (`tiny_q4_1_gguf`). The tests read what was written with
a reader of their own, as before.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from gguf import GGUFReader

from bench import random_gguf
from bench.random_gguf import write_random_gguf
from models.default_model import default_model_path

TINY = dict(
    block_count=2, embedding_length=64, feed_forward_length=96, head_count=4, head_count_kv=2,
    rope_freq_base=10000.0, rms_eps=1e-5, context_length=256,
)  # fmt: skip


@pytest.fixture(scope="session")
def default_vocab_reader() -> GGUFReader:
    """gguf-py's reader of the default model's GGUF (read-only), parsed once."""
    return GGUFReader(default_model_path())


def _patch_writer(patch: pytest.MonkeyPatch, default_reader: GGUFReader) -> None:
    """`write_random_gguf` knows the "tiny" shape and reuses the parsed default vocabulary."""
    default = Path(default_model_path()).resolve()

    def reader(path) -> GGUFReader:
        return default_reader if Path(path).resolve() == default else GGUFReader(path)

    patch.setitem(random_gguf.SHAPES, "tiny", TINY)
    patch.setattr(random_gguf, "GGUFReader", reader)


@pytest.fixture
def random_gguf_writer(monkeypatch, default_vocab_reader) -> None:
    """For tests that write their own files: the "tiny" shape, the vocabulary read once."""
    _patch_writer(monkeypatch, default_vocab_reader)


@pytest.fixture(scope="session")
def tiny_q4_1_gguf(tmp_path_factory, default_vocab_reader) -> Path:
    """`write_random_gguf(path, "Q4_1", shape="tiny")` (seed 0), written once: never modify it."""
    with pytest.MonkeyPatch.context() as patch:
        _patch_writer(patch, default_vocab_reader)
        path = write_random_gguf(tmp_path_factory.mktemp("gguf") / "tiny.gguf", "Q4_1", "tiny")
    return path
