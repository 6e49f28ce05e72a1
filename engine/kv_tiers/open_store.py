"""Opening the K/V tiers for an engine being built: its namespace and its `TierStore`.

Contract: `open_tier_store(config, path, tokenizer, built, random_weights)` returns the store
for `config.kv_tiers` over the runner's KV cache, under the namespace of what decides the K/V
bytes (keys.py): the model's identity (its resolved path, and the name, size and modification
time of its files, so weights replaced in place are a new model; a random-weights shape its
config and seed), the weight and activation quantization, the tokenizer, the dtype, the KV
cache dtype (with the int8 rows' layout version), the forward path and the tgserve version.
None when the runner holds no local KV cache (tensor parallel: every rank holds a shard; tiers
are refused there by the config) and for an encoder-decoder model (its prefix is the encoder's, reused whole: not tiered).
"""

from __future__ import annotations

import hashlib
import json
import logging
from pathlib import Path
from typing import Any

from engine.config import EngineConfig
from engine.kv_tiers.keys import TierNamespace, tgserve_version
from engine.kv_tiers.tier_store import TierStore
from models import kv_fp8, kv_quant

log = logging.getLogger("tgserve.engine")


def kv_dtype_name(cache: Any, v_cache: Any = None) -> str:
    """The cache's element dtype, with the int8 (fp8) rows' layout version (models/kv_quant.py,
    models/kv_fp8.py): rows of another layout are other bytes for the same tokens. With a V
    cache of another dtype (int8v: float16 K, int8 V rows) both parts' names, K's first."""
    if v_cache is not None and v_cache.dtype != cache.dtype:
        return f"K {kv_dtype_name(cache)}, V {kv_dtype_name(v_cache)}"
    if kv_fp8.is_fp8(cache):  # bytes: the name says what they hold
        return f"{cache.dtype}|{kv_fp8.LAYOUT}"
    return f"{cache.dtype}|{kv_quant.LAYOUT}" if kv_quant.is_quantized(cache) else str(cache.dtype)


def model_identity(path: Path, random_weights: dict[str, Any] | None, seed: int) -> str:
    if random_weights is not None:
        shape = json.dumps(random_weights, sort_keys=True, default=str)
        return f"random:{path.name}:{hashlib.sha256(shape.encode()).hexdigest()}:seed={seed}"
    path = path.resolve()
    files = sorted(p for p in path.iterdir() if p.is_file()) if path.is_dir() else [path]
    stamps = []
    for f in files:
        st = f.stat()
        stamps.append(f"{f.name}:{st.st_size}:{st.st_mtime_ns}")
    return f"{path}|" + hashlib.sha256("\n".join(stamps).encode()).hexdigest()


def open_tier_store(
    config: EngineConfig,
    path: Path,
    tokenizer: Any,
    built: Any,  # engine.runner_factory.BuiltRunner
    random_weights: dict[str, Any] | None,
) -> TierStore | None:
    kv_caches = getattr(built.runner, "kv_caches", None)
    if config.kv_tiers is None or not kv_caches:
        return None
    if getattr(built.model_config, "is_encoder_decoder", False):
        log.warning("K/V tiers are not used with encoder-decoder models (cross-attention K/V)")
        return None
    model = model_identity(path, random_weights, config.seed)
    quant = f"q={config.quantization},aq={config.activation_quantization},deq={config.dequantize}"
    tok = "none" if tokenizer is None else f"{type(tokenizer).__name__}:{tokenizer.vocab_size}"
    namespace = TierNamespace(
        model=f"{model}|{quant}",
        tokenizer=tok,
        dtype=built.dtype_name,
        kv_dtype=kv_dtype_name(*kv_caches[0]),
        forward_path=built.runner.forward_path.description,
        version=tgserve_version(),
    )
    return TierStore(config.kv_tiers, namespace, kv_caches)
