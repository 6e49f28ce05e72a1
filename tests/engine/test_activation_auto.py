"""`activation_quantization="auto"`, the default (engine/activation_choice.py): int16 activations
where a GGUF's Q4_0 / Q4_1 / Q8_0 blocks are served as stored by an AVX2 build of the CPU
kernels, float elsewhere.

Oracles: the engine asked explicitly for "int16" (auto must be exactly it where it applies: the
same layers, the same greedy tokens and logprobs) and asked for "none" (exactly it where auto
does not apply: AVX-512 builds, K-quant files); the file's own tensor types (a K-quant file has
no block to convert)."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from engine import Engine, EngineConfig, SamplingParams, activation_choice
from engine.activation_choice import auto_mode, avx2_build, wants_int16
from models import cpu_kernels
from models.cpu_features import ISA_ENV, cpu_flags
from tests.models.gguf.test_stored import tiny_quantised_gguf

pytestmark = pytest.mark.skipif(
    not cpu_kernels.is_available() or "avx2" not in cpu_flags(),
    reason="needs tgserve's C++ CPU kernels on a CPU with AVX2",
)
CPU = torch.device("cpu")
BASE = dict(dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4, device="cpu")
PARAMS = SamplingParams(max_tokens=10, temperature=0.0, logprobs=1, ignore_eos=True)


def _kinds(engine: Engine) -> set[str]:
    return {type(m).__name__ for m in engine.runner.model.modules()} & {"BlockLinear", "Q8Linear"}


def _greedy(engine: Engine) -> tuple[list[int], list[float]]:
    out = engine.generate([[5, 9, 3, 7, 11]], PARAMS)[0].outputs[0]
    return out.token_ids, [step.logprob for step in out.logprobs]


def test_auto_is_int16_on_an_avx2_build_and_none_elsewhere(tmp_path) -> None:
    path = tiny_quantised_gguf(tmp_path, QT.Q4_1, tied=True)
    auto = Engine.from_model(str(path), EngineConfig(**BASE))
    mode = auto_mode()
    same = Engine.from_model(str(path), EngineConfig(**BASE, activation_quantization=mode))
    off = Engine.from_model(str(path), EngineConfig(**BASE, activation_quantization="none"))
    assert auto.config.activation_quantization == mode  # the engine names what runs
    assert _kinds(auto) == _kinds(same) == ({"Q8Linear"} if mode else {"BlockLinear"})
    assert off.config.activation_quantization is None and _kinds(off) == {"BlockLinear"}
    assert _greedy(auto) == _greedy(same)


def test_the_build_decides(monkeypatch) -> None:
    monkeypatch.setenv(ISA_ENV, "avx2")  # a forced AVX2 build: int16 on any host
    assert avx2_build()
    monkeypatch.setenv(ISA_ENV, "portable")  # the scalar loops: float
    assert not avx2_build()
    monkeypatch.setenv(ISA_ENV, "native")
    assert avx2_build() == ("avx512f" not in cpu_flags())


def test_auto_keeps_float_activations_where_no_block_converts(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv(ISA_ENV, "avx2")
    monkeypatch.setattr(activation_choice, "INT16_BY_DEFAULT", True)
    # a K-quant file's matrices stay blocks the integer kernels do not read
    kquant = tiny_quantised_gguf(tmp_path, QT.Q4_K, tied=True)
    assert not wants_int16(kquant, EngineConfig(**BASE), CPU, False, None)


def test_auto_asks_for_int16_only_where_the_blocks_are_served_as_stored(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv(ISA_ENV, "avx2")
    monkeypatch.setattr(activation_choice, "INT16_BY_DEFAULT", True)
    path = tiny_quantised_gguf(tmp_path, QT.Q8_0, tied=False)
    config = EngineConfig(**BASE)
    assert wants_int16(path, config, CPU, False, None)
    assert not wants_int16(path, config, torch.device("cuda"), False, None)
    assert not wants_int16(path, config, CPU, True, None)  # a tensor-parallel rank
    assert not wants_int16(path, config, CPU, False, {"model_type": "llama"})  # random weights
    for field in ({"dequantize": True}, {"quantization": "int8"}, {"cpu_kernels": False}):
        assert not wants_int16(path, EngineConfig(**BASE, **field), CPU, False, None), field
    assert not wants_int16(
        path, EngineConfig(**BASE, activation_quantization=None), CPU, False, None
    )
    assert not wants_int16(tmp_path, config, CPU, False, None)  # a folder is not a GGUF
    assert not wants_int16(path, config, CPU, False, None, "bfloat16")  # bf16 block kernels
    monkeypatch.setenv(ISA_ENV, "portable")
    assert not wants_int16(path, config, CPU, False, None)
    monkeypatch.setenv(ISA_ENV, "avx2")
    monkeypatch.setattr(activation_choice, "INT16_BY_DEFAULT", False)  # the rule switched off
    assert not wants_int16(path, config, CPU, False, None) and auto_mode() is None
