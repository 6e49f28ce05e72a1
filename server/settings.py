"""Settings of `tgserve serve`: the values of the options (server/options.py), and where each comes
from.

Contract: `add_arguments(parser)` declares every flag with no default, so `Settings.resolve(args,
environ)` can tell "not given" apart: the flag wins, then the environment variable
(TGSERVE_<DEST>, read when `resolve` is called, never at import), then the default. Every bad
value is a `ValueError` naming the flag and its variable.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from server.options import (
    ENGINE_DEFAULT,
    OPTIONS,
    REASONING_PARSERS,
    TOOL_CALL_PARSERS,
    Option,
    parse_size,
    words,
)


@dataclass(frozen=True)
class Settings:
    model: str | None = None
    host: str = "0.0.0.0"
    port: int = 8000
    api_key: tuple[str, ...] = field(default=(), repr=False)  # secrets never reach a log
    served_model_name: tuple[str, ...] = ()
    dtype: str = "auto"
    device: str = "auto"
    quantization: str | None = None
    activation_quantization: str | None = "auto"  # engine/activation_choice.py
    kv_cache_dtype: str = "auto"  # models/kv_quant.py
    max_model_len: int | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    target_itl_ms: float | None = None  # None: the engine's default; 0: no step-time target
    kv_cache_memory: int | None = None
    max_queued_requests: int | None = None
    grammar_compile_timeout: float = 10.0
    grammar_cache_bytes: int = 512 * 1024 * 1024
    disable_prefix_caching: bool = False
    kv_offload_dir: str | None = None  # K/V tiers behind the pool (engine/kv_tiers)
    kv_offload_bytes: int | None = None
    kv_offload_ram_bytes: int | None = None
    disable_cpu_kernels: bool = False
    dequantize: bool = False
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    nnodes: int | None = None  # None: torchrun's variables, else 1 (engine's Cluster)
    node_rank: int | None = None
    master_addr: str | None = None
    master_port: int | None = None
    dist_init_timeout: float | None = None
    role: str | None = None  # prefill/decode disaggregation (server/disagg.py); None: both
    kv_transfer_addr: str | None = None
    prefill_url: str | None = None
    kv_transfer_timeout: float = 30.0
    enforce_eager: bool = False
    batch_invariant: bool = False
    speculative: str | None = None
    num_speculative_tokens: int | None = None
    speculative_ngram_min: int | None = None
    speculative_ngram_max: int | None = None
    speculative_model: str | None = None
    lora: tuple[tuple[str, str], ...] = ()  # (name, path) of each --lora
    max_loras: int | None = None
    max_lora_rank: int | None = None
    enable_lora_runtime_updates: bool = False
    shutdown_timeout: float = 30.0
    request_timeout: float | None = None
    health_stall_timeout: float = 120.0
    sse_keepalive: float = 15.0  # seconds without an event before an SSE comment; 0: none
    responses_store_size: int = 1024  # stored /v1/responses, least recently used dropped first
    max_body_bytes: int = 4 * 1024 * 1024
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    max_connections: int = 1000
    header_timeout: float = 10.0
    body_timeout: float = 60.0
    keep_alive_timeout: float = 5.0
    max_requests_per_connection: int = 10_000
    max_prompts_per_request: int = 0  # 0: server/fair_share.py's share of the in-flight limit
    priority_keys: tuple[str, ...] = field(default=(), repr=False)  # "*": every client
    public_routes: tuple[str, ...] = ("/health", "/ready", "/metrics")
    allowed_origins: tuple[str, ...] = ()  # each flag value parses to a tuple: flattened below
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"
    vllm_compatible_metrics: bool = False
    otlp_traces_endpoint: str | None = None
    log_level: str = "info"
    enable_fault_injection: bool = False
    enable_sleep_mode: bool = False  # POST /sleep, /wake_up, GET /is_sleeping (server/sleep.py)
    sleep_idle_timeout: float | None = None  # seconds idle before a level-1 sleep

    def __post_init__(self) -> None:
        flat = tuple(
            origin
            for item in self.allowed_origins
            for origin in ((item,) if isinstance(item, str) else item)
        )
        object.__setattr__(self, "allowed_origins", flat)
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        for flag, size in (
            ("--tensor-parallel-size", self.tensor_parallel_size),
            ("--pipeline-parallel-size", self.pipeline_parallel_size),
        ):
            if size < 1:
                raise ValueError(f"{flag} must be at least 1, got {size}")
        if self.max_body_bytes < 1024:
            raise ValueError(f"--max-body-bytes must be at least 1KiB, got {self.max_body_bytes}")
        if not (self.shutdown_timeout >= 0 and math.isfinite(self.shutdown_timeout)):
            raise ValueError(f"--shutdown-timeout must be >= 0, got {self.shutdown_timeout}")
        if self.max_header_bytes < 1024:
            raise ValueError(
                f"--max-header-bytes must be at least 1KiB, got {self.max_header_bytes}"
            )
        if self.responses_store_size < 0:
            raise ValueError(
                f"--responses-store-size must be >= 0, got {self.responses_store_size}"
            )
        if self.max_connections < 1 or self.max_requests_per_connection < 1:
            raise ValueError(
                "--max-connections and --max-requests-per-connection must be at least 1, got "
                f"{self.max_connections} and {self.max_requests_per_connection}"
            )
        if self.max_headers < 8:
            raise ValueError(f"--max-headers must be at least 8, got {self.max_headers}")
        if any(not key for key in self.api_key):
            raise ValueError("--api-key must not be empty")
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise ValueError(
                f"--tool-call-parser must be one of {', '.join(TOOL_CALL_PARSERS)}, "
                f"got {self.tool_call_parser!r}"
            )
        if self.reasoning_parser not in REASONING_PARSERS:
            raise ValueError(
                f"--reasoning-parser must be one of {', '.join(REASONING_PARSERS)}, "
                f"got {self.reasoning_parser!r}"
            )
        if self.role is not None:
            _check_role(self)
        if self.sleep_idle_timeout is not None and not self.enable_sleep_mode:
            raise ValueError("--sleep-idle-timeout needs --enable-sleep-mode")
        if self.log_level.lower() not in ("debug", "info", "warning", "error"):
            raise ValueError(
                f"--log-level must be debug, info, warning or error, got {self.log_level!r}"
            )

    @classmethod
    def resolve(cls, args: argparse.Namespace, environ: Mapping[str, str]) -> Settings:
        values: dict[str, Any] = {}
        for option in OPTIONS:
            given = getattr(args, option.dest, None)
            if given is not None and given != [] and given is not False:
                values[option.dest] = tuple(given) if option.repeatable else given
            elif option.env in environ:
                values[option.dest] = _from_env(option, environ[option.env])
        return cls(**values)


def _check_role(settings: Settings) -> None:
    """--role's companions (README "More than one machine": prefill/decode)."""
    host, _, port = (settings.kv_transfer_addr or "").rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise ValueError(
            f"--role {settings.role} needs --kv-transfer-addr HOST:PORT (the decode server's "
            f"address and a free port), got {settings.kv_transfer_addr!r}"
        )
    if settings.role == "decode" and not (settings.prefill_url or "").startswith("http"):
        raise ValueError("--role decode needs --prefill-url http://HOST:PORT (its prefill server)")
    parallel = settings.tensor_parallel_size * settings.pipeline_parallel_size > 1
    if parallel or settings.disable_prefix_caching:
        raise ValueError(
            f"--role {settings.role} needs prefix caching and no tensor or pipeline parallelism"
        )


def _from_env(option: Option, raw: str) -> Any:
    try:
        if option.repeatable:
            return tuple(option.parse(w) for w in words(raw))
        value = option.parse(raw)
    except ValueError as exc:
        raise ValueError(f"{option.env} (or {option.flag}): {exc}") from None
    if option.choices and value not in option.choices:
        raise ValueError(
            f"{option.env} (or {option.flag}) must be one of {', '.join(option.choices)}, "
            f"got {raw!r}"
        )
    return value


def shown_default(option: Option) -> str:
    """The default as `--help` says it: in words where the value is None or a switch."""
    if option.default == ENGINE_DEFAULT:
        from engine import EngineConfig  # pure Python: the engine's own defaults, said once

        return str(getattr(EngineConfig, option.dest))
    if option.default is not None:
        return option.default
    value = {f.name: f.default for f in fields(Settings)}[option.dest]
    if isinstance(value, bool):
        return "on" if value else "off"
    if isinstance(value, tuple):
        return ", ".join(value) if value else "none"
    if value is None:
        raise ValueError(f"{option.flag}: say in Option.default what unset means")
    if option.parse is parse_size and value % 1024 == 0:
        return (
            f"{value // 1024 // 1024}MiB" if value % (1024 * 1024) == 0 else f"{value // 1024}KiB"
        )
    return str(value)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    for option in OPTIONS:
        help_text = f"{option.help} (default: {shown_default(option)}) [env {option.env}]"
        help_text = help_text.replace("%", "%%")  # argparse formats help with %
        if option.flag_is_switch:
            parser.add_argument(
                option.flag, dest=option.dest, action="store_true", default=None, help=help_text
            )
        elif option.repeatable:
            parser.add_argument(
                option.flag, dest=option.dest, action="append", type=option.parse, help=help_text
            )
        else:
            parser.add_argument(
                option.flag,
                dest=option.dest,
                type=_argparse_type(option),
                choices=option.choices or None,
                help=help_text,
            )


def _argparse_type(option: Option) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return option.parse(text)
        except ValueError as exc:  # argparse prints ArgumentTypeError's message as is
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = option.dest
    return convert
