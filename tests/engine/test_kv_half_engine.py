"""What cannot hold a float32 model's float16 K/V rows (`--kv-cache-dtype float16`,
models/kv_half.py) says so, naming the flag: a bfloat16 model (its cache is 2 bytes a value
already), a float32 one on CUDA (the Triton kernels read a cache of the queries' dtype); a float16
model's own cache is float16 already (allowed: the same as auto); `int8v` (float16 K, int8 V
rows) likewise, and without the C++ kernels too, even for a float16 model (its V rows are
int8). A float16 (int8v) pool's block count,
batch invariance, preemption, prefix sharing and tiers: tests/engine/test_kv_int8_engine.py
(parametrized over int8 and float16)."""

from __future__ import annotations

import pytest

from engine.config import EngineConfig
from engine.kv_sizing import kv_cache_dtype_refusal, kv_pair_bytes, kv_row_layout
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


def test_what_cannot_hold_int8v_rows_refuses_them(tmp_path) -> None:
    with pytest.raises(ValueError, match="int8v rounds a float32 model's K"):
        tiny_engine(tmp_path / "llama", dtype="bfloat16", kv_cache_dtype="int8v")
    with pytest.raises(ValueError, match="--disable-cpu-kernels turns off"):
        tiny_engine(tmp_path / "llama", kv_cache_dtype="int8v", cpu_kernels=False)
    config = EngineConfig(kv_cache_dtype="int8v")
    assert "--kv-cache-dtype int8v" in kv_cache_dtype_refusal(config, "cuda", "float32")
    assert "--kv-cache-dtype int8v" in kv_cache_dtype_refusal(config, "cpu", "float16")
    assert kv_cache_dtype_refusal(config, "cpu", "float32") is None
    # a (token, KV head)'s K and V bytes: 2 D + (D + 4) = 196 at head_dim 64 (int8 136,
    # float16 256, float32 512)
    assert kv_pair_bytes("int8v", 64, "float32") == 196
    assert [kv_pair_bytes(k, 64, "float32") for k in ("int8", "float16", "auto")] == [136, 256, 512]
