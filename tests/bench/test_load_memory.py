"""The benchmarks' memory figures (bench/load_memory.py; the held bytes bench/backends/tgserve.py
reads from `Engine.describe()`): the report text on hand-worked numbers, and tgserve's held bytes
and KV bytes per token against the checkpoint file and the KV cache's own shape."""

from __future__ import annotations

from pathlib import Path
from unittest.mock import ANY

import pytest
import torch
from safetensors import safe_open

from bench.backends import BackendOptions, load_backend
from bench.load_memory import LoadMemory, render
from bench.model_source import resolve_model
from models.cpu_kernels import extension as cpu_kernels_extension
from models.gguf.file import open_gguf
from tests.checkpoints import save_checkpoint

MIB = 2**20
F32_TYPE_ID = 0  # GGML's float32: the norms of a random GGUF


def test_render_splits_the_growth_and_compares_weights_with_the_file():
    memory = LoadMemory(rss_before=100 * MIB, rss_after=400 * MIB, file_tensor_bytes=250 * MIB)
    text = render(memory, {"weights": 250 * MIB, "KV cache": 40 * MIB}, rss_now=410 * MIB)
    assert text == (
        "weights 250 MiB = 1.00x the file's tensors (250 MiB); RSS before load 100 MiB, after "
        "load 400 MiB (+300 = weights 250 + KV cache 40 + other 10), after the runs 410 MiB"
    )
    # Nothing known but RSS (a peer), or nothing at all.
    assert render(LoadMemory(0, 30 * MIB, None), {}, None) == (
        "RSS before load 0 MiB, after load 30 MiB (+30)"
    )
    assert render(LoadMemory(None, None, None), {}, None) == "RSS not readable here"


@pytest.fixture(scope="module")
def tiny_llama(tmp_path_factory) -> Path:
    return save_checkpoint("llama", tmp_path_factory.mktemp("mem") / "tiny-llama", seed=0)


@pytest.mark.parametrize("cpu_kernels", [True, False])
def test_tgserve_holds_the_checkpoints_weights_and_its_kv_cache(tiny_llama, cpu_kernels):
    with safe_open(str(tiny_llama / "model.safetensors"), framework="pt") as f:
        file_bytes = sum(f.get_tensor(name).nbytes for name in f.keys())  # noqa: SIM118
    source = resolve_model(tiny_llama)
    c = source.config
    options = BackendOptions("float32", 4, 64, 4, False, 64, 4, cpu_kernels=cpu_kernels)
    backend = load_backend("tgserve", source, options)
    try:
        held = backend.held
        engine = backend.engine
        rotary = 4 * c.head_dim // 2  # the float32 inverse frequencies, a buffer
        assert held["weights"] == file_bytes + rotary  # float32 file loaded in float32
        slots = engine.runner.kv_caches[0][0].shape[0] * engine.config.block_size
        per_token = 2 * c.num_layers * c.num_kv_heads * c.head_dim * 4  # K and V, float32
        assert held["KV cache"] == slots * per_token
        described = engine.describe()
        assert described.kv_bytes_per_token == per_token and described.kv_cache_itemsize == 4
        # Without GQA every query head would hold K and V: the saving bench reports.
        no_gqa = 2 * c.num_layers * c.num_heads * c.head_dim * 4
        assert described.kv_bytes_per_token_all_heads == no_gqa and c.num_heads > c.num_kv_heads
        assert described.cpu_kernels == cpu_kernels and not described.cuda_graphs  # a CPU
        assert not described.gguf_blocks_as_stored  # a safetensors checkpoint
        step = engine.runner.forward_path.description.startswith("forward steps by tgserve's C++")
        if step:  # every dense linear packed once more: what the kernels' packing makes
            ext = cpu_kernels_extension()
            linears = [m for m in engine.runner.model.modules() if isinstance(m, torch.nn.Linear)]
            assert held["packed copies"] == sum(ext.pack_linear(m.weight).nbytes for m in linears)
        else:
            assert "packed copies" not in held
        assert step == cpu_kernels
        memory = backend.load_memory
        assert memory.rss_after >= memory.rss_before > 0 and memory.file_tensor_bytes is None
    finally:
        backend.close()


def test_a_gguf_kept_as_stored_holds_its_blocks_once_and_no_packed_copy(tiny_q4_1_gguf):
    """The file's header is the oracle: every quantised tensor's bytes once (the tied LM head
    shares the embedding's blocks; fused q/k/v and gate/up keep their rows), the float32 norms
    loaded in bfloat16, and the rotary inverse frequencies; the C++ step runs blocks in place."""
    path = tiny_q4_1_gguf  # tests/bench/conftest.py: the tiny shape's Q4_1 file
    infos = open_gguf(path).infos
    blocks = sum(i.nbytes for i in infos if i.type_id != F32_TYPE_ID)
    norms_bf16 = sum(i.nbytes // 2 for i in infos if i.type_id == F32_TYPE_ID)
    source = resolve_model(path)
    # float activations: the blocks read in place ("auto" repacks them for int16 activations on
    # an AVX2 build: engine/activation_choice.py)
    options = BackendOptions(
        "bfloat16", 4, 64, 4, False, 64, 4, cpu_kernels=True, activation_quantization=None
    )
    backend = load_backend("tgserve", source, options)
    try:
        rotary = 4 * source.config.head_dim // 2
        assert backend.held == {"weights": blocks + norms_bf16 + rotary, "KV cache": ANY}
        described = backend.engine.describe()
        assert described.gguf_blocks_as_stored and described.cpu_kernels
        assert backend.note.endswith(", C++ CPU kernels, GGUF blocks as stored")
    finally:
        backend.close()
