"""The engine's public API: what the server floor (and the benchmark tool) may import.

`Engine` (the synchronous step loop, built by `Engine.from_model`) implements `EngineCore`; it
is imported on first use, so importing this package does not import torch (the HTTP floor
stays light);
`Engine.describe()` returns an `EngineDescription` (the forward path in use, CUDA graphs, held
bytes) for reports; `resolve_device`, `resolve_dtype_name` and `dtype_bytes` are the config's
own rules for what `device="auto"` / `dtype="auto"` become and a dtype's size, and
`serves_blocks_as_stored` (loaded on first use) what `resolve_dtype_name` is told of a model.
`AsyncEngine` drives any `EngineCore` from asyncio; requests go in as `SamplingParams` and come
out as `RequestOutput` deltas (see engine/requests/outputs.py); `EngineCore.new_request` returns
a `Request`, which an engine of one's own (the tests' fake engine) builds too. `EncoderLayout`
says how an encoder-decoder request lays out its tokens (what `max_model_len` must hold);
`KVTierConfig` / `kv_tier_config` the K/V tiers behind the pool (engine/kv_tiers: RAM, disk);
`LoraConfig` the LoRA adapters an engine serves (`parse_lora_flag` reads `--lora NAME=PATH`;
`AsyncEngine.adapters` loads and unloads them while serving: `AdapterInUse`, `AdapterSlotsBusy`);
`GenerationDefaults` what a model folder's generation_config.json asks of unset fields;
`release_kv_pool` / `restore_kv_pool` (loaded on first use) a level-1 sleep's (engine/sleep.py);
`warm_up_requests` / `warm_up` what an engine runs before its first request (a server at
start-up, the benchmark after loading); `fake_device_engine` an engine with no model whose
steps take a fixed device time (engine/fake_device.py: the host's share of a step, measured),
`device_cpu_seconds(engine)` its device thread's CPU time so far (0.0 for a real engine).
`Cluster` says which machines a tensor-parallel group spans (`leader_engine(model_path,
config, cluster, progress)`, Engine.from_model's equal, on rank 0's machine;
`serve_follower_node(model_path, cluster)` on each other one). `open_kv_link(engine, role,
addr, timeout_s)` (loaded on first use) joins a prefill or decode server's K/V transfer group
(engine/kv_transfer; its errors `KVPeerError`, `KVSenderFull`).
"""

from engine.api import EngineCore, EngineInfo
from engine.async_engine import AsyncEngine
from engine.config import EngineConfig, dtype_bytes, resolve_device, resolve_dtype_name
from engine.description import EngineDescription
from engine.encoder_layout import EncoderLayout
from engine.errors import (
    EngineUnavailable,
    FatalEngineError,
    InvalidRequest,
    Overloaded,
    QueueFullError,
)
from engine.kv_tiers.config import KVTierConfig, kv_tier_config
from engine.kv_transfer.errors import KVPeerError, KVSenderFull
from engine.lora_adapters import AdapterInUse, AdapterSlotsBusy
from engine.lora_config import LoraConfig, parse_lora_flag
from engine.parallel.cluster import Cluster
from engine.requests.fault_spec import FaultSpec
from engine.requests.generation_defaults import GenerationDefaults
from engine.requests.outputs import (
    CompletionOutput,
    OutputAccumulator,
    RequestMetrics,
    RequestOutput,
    StepEvent,
)
from engine.requests.plain_output import PlainOutput
from engine.requests.request import Request
from engine.requests.request_stream import RequestStream
from engine.requests.sampling_params import (
    GREEDY_BELOW_TEMPERATURE,
    MAX_N,
    MAX_STOP_STRINGS,
    SamplingParams,
)
from engine.requests.structured_output import StructuredOutput
from engine.speculative.config import SpeculativeConfig, speculative_config
from engine.speculative.counters import SpeculationStats
from engine.stats import EngineStats
from engine.types import FINISH_REASONS, TokenLogprob
from engine.warm_up import warm_up, warm_up_requests

__all__ = [
    "FINISH_REASONS",
    "GREEDY_BELOW_TEMPERATURE",
    "MAX_N",
    "MAX_STOP_STRINGS",
    "AdapterInUse",
    "AdapterSlotsBusy",
    "AsyncEngine",
    "Cluster",
    "CompletionOutput",
    "Engine",
    "EngineConfig",
    "EngineCore",
    "EncoderLayout",
    "EngineDescription",
    "EngineInfo",
    "EngineStats",
    "EngineUnavailable",
    "FatalEngineError",
    "FaultSpec",
    "GenerationDefaults",
    "InvalidRequest",
    "KVPeerError",
    "KVSenderFull",
    "KVTierConfig",
    "LoraConfig",
    "OutputAccumulator",
    "Overloaded",
    "PlainOutput",
    "QueueFullError",
    "Request",
    "RequestMetrics",
    "StepEvent",
    "RequestOutput",
    "RequestStream",
    "SamplingParams",
    "SpeculationStats",
    "SpeculativeConfig",
    "StructuredOutput",
    "TokenLogprob",
    "device_cpu_seconds",
    "dtype_bytes",
    "fake_device_engine",
    "kv_tier_config",
    "parse_lora_flag",
    "resolve_device",
    "resolve_dtype_name",
    "leader_engine",
    "open_kv_link",
    "serve_follower_node",
    "release_kv_pool",
    "restore_kv_pool",
    "serves_blocks_as_stored",
    "speculative_config",
    "warm_up",
    "warm_up_requests",
]


def device_cpu_seconds(engine: object) -> float:
    """CPU seconds a fake-device engine's device thread has spent (its logits and sampling),
    which a host-time benchmark subtracts from the process's; 0.0 for any other engine."""
    return float(getattr(engine.runner, "device_cpu_s", 0.0))


def __getattr__(name: str):
    if name == "Engine":
        from engine.engine import Engine

        return Engine
    if name == "fake_device_engine":  # a model-free engine for host-time benchmarks
        from functools import partial

        from engine.engine import Engine
        from engine.engine_factory import fake_device_engine

        return partial(fake_device_engine, Engine)
    if name == "leader_engine":  # Engine.from_model on rank 0 of a group over machines
        from functools import partial

        from engine.engine import Engine
        from engine.engine_factory import leader_engine

        return partial(leader_engine, Engine)
    if name == "open_kv_link":  # prefill/decode disaggregation; imports torch
        from engine.kv_transfer.link import open_kv_link

        return open_kv_link
    if name == "serve_follower_node":  # a machine of a group that does not hold rank 0
        from engine.parallel.follower import serve_follower_node

        return serve_follower_node
    if name in ("release_kv_pool", "restore_kv_pool"):  # level-1 sleep; imports torch
        from engine import sleep

        return getattr(sleep, name)
    if name == "serves_blocks_as_stored":  # imports torch: loaded on first use, as Engine
        from engine.runner_factory import serves_blocks_as_stored

        return serves_blocks_as_stored
    raise AttributeError(f"module 'engine' has no attribute {name!r}")
