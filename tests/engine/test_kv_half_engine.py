"""What cannot hold a float32 model's float16 K/V rows (`--kv-cache-dtype float16`,
models/kv_half.py) says so, naming the flag: a bfloat16 model (its cache is 2 bytes a value
already), a float32 one on CUDA (the Triton kernels read a cache of the queries' dtype); a float16
model's own cache is float16 already (allowed: the same as auto). A float16 pool's block count,
batch invariance, preemption, prefix sharing and tiers: tests/engine/test_kv_int8_engine.py
(parametrized over int8 and float16)."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.kv_sizing import kv_cache_dtype_refusal, kv_row_layout
from tests.engine.engine_fixtures import tiny_engine

pytestmark = pytest.mark.cpu_kernels


def test_what_cannot_hold_float16_rows_refuses_them(tmp_path) -> None:
    with pytest.raises(ValueError, match="this model runs in bfloat16: use --kv-cache-dtype auto"):
        tiny_engine(tmp_path / "llama", dtype="bfloat16", kv_cache_dtype="float16")
    config = EngineConfig(kv_cache_dtype="float16")
    refusal = kv_cache_dtype_refusal(config, "cuda", "float32")
    assert "--kv-cache-dtype float16" in refusal and "--dtype float16" in refusal
    assert kv_cache_dtype_refusal(config, "cuda", "float16") is None  # its own cache's dtype
    assert kv_cache_dtype_refusal(config, "cpu", "float32") is None
    assert kv_row_layout("float16", 64, "float32") == (64, 2)
