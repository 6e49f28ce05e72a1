"""Settings of `tgserve serve`: one table of options, each a CLI flag and a TGSERVE_* variable.

Contract: `add_arguments(parser)` declares every flag with no default, so `Settings.resolve(args,
environ)` can tell "not given" apart: the flag wins, then the environment variable
(TGSERVE_<DEST>, read when `resolve` is called, never at import), then the default. Every bad
value is a `ValueError` naming the flag and its variable.
"""

from __future__ import annotations

import argparse
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, fields
from typing import Any

# Kept in step with server/tool_calls.PARSERS (a test checks it); not imported, so parsing
# settings stays free of the parsers' imports.
TOOL_CALL_PARSERS = ("auto", "hermes", "llama3_json", "mistral")
REASONING_PARSERS = ("auto", "think", "none")
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from "1073741824", "512MiB" (powers of 1024) or "2GB" / "2G" (powers of 1000)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"expected a size such as 2GiB, 512MiB or 1000000000, got {text!r}")
    number, unit, binary = match.groups()
    base = 1024 if binary else 1000
    return int(float(number) * base ** " kmgt".index(unit.lower() or " "))


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"expected a positive number of seconds, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _milliseconds(text: str) -> float:
    value = float(text)
    if not (value == 0 or 1 <= value <= 60_000):
        raise ValueError(f"expected 0 (off) or milliseconds in [1, 60000], got {text!r}")
    return value


def _words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(",") if w.strip())


def _origins(text: str) -> tuple[str, ...]:
    """Origins from one flag value: `*` or scheme://host[:port], a trailing slash dropped."""
    origins = tuple(o.rstrip("/") for o in _words(text))
    for origin in origins:
        if origin != "*" and not re.match(r"^https?://[^/\s]+$", origin):
            raise ValueError(f"expected * or an origin such as https://app.example, got {origin!r}")
    return origins


@dataclass(frozen=True)
class _Option:
    dest: str
    parse: Callable[[str], Any]
    help: str
    repeatable: bool = False  # the flag may be given several times; the variable is a comma list
    flag_is_switch: bool = False

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")

    @property
    def env(self) -> str:
        return "TGSERVE_" + self.dest.upper()


OPTIONS: tuple[_Option, ...] = (
    _Option("model", str, "HF folder or GGUF file to serve (default: SmolLM2-135M-Instruct)"),
    _Option("host", str, "address to listen on"),
    _Option("port", int, "port to listen on"),
    _Option("api_key", str, "accepted Bearer key (repeatable)", repeatable=True),
    _Option("served_model_name", str, "model name(s) clients use (repeatable)", repeatable=True),
    _Option("dtype", str, "auto | float32 | bfloat16 | float16"),
    _Option("device", str, "auto | cpu | cuda | cuda:N"),
    _Option("quantization", str, "none | int8 (weight-only int8 linears, opt-in)"),
    _Option("max_model_len", int, "context length admitted (default: the model's)"),
    _Option("block_size", int, "tokens per KV cache block"),
    _Option("max_num_seqs", int, "sequences running at once"),
    _Option(
        "max_num_batched_tokens",
        int,
        "upper bound on the tokens of one engine step, for experts (below it --target-itl-ms "
        "sizes prefill chunks; a step with no token to deliver to a stream fills it)",
    ),
    _Option(
        "target_itl_ms",
        _milliseconds,
        "step-time target while streams decode: prefill chunks are sized so a step that "
        "delivers tokens to a stream stays under it (0: off, steps fill --max-num-batched-tokens; "
        "default: the engine's, 100 ms)",
    ),
    _Option(
        "kv_cache_memory",
        parse_size,
        "KV cache budget, e.g. 2GiB (default: a share of free memory)",
    ),
    _Option(
        "max_queued_requests",
        int,
        "requests that may wait beyond the running ones: in flight = --max-num-seqs + this; "
        "beyond it 429 with Retry-After",
    ),
    _Option("disable_prefix_caching", _bool, "turn prefix caching off", flag_is_switch=True),
    _Option(
        "disable_cpu_kernels",
        _bool,
        "keep to PyTorch ops on CPU (default: tgserve's C++ decode kernels, built at start-up)",
        flag_is_switch=True,
    ),
    _Option(
        "dequantize",
        _bool,
        "GGUF files: dequantise every tensor to --dtype (default: Q4_0/Q4_1/Q5_0/Q5_1/Q8_0/Q4_K/Q5_K/Q6_K kept as stored)",
        flag_is_switch=True,
    ),
    _Option(
        "tensor_parallel_size",
        int,
        "ranks (processes; GPUs on CUDA) one replica's model is split over, through "
        "torch.distributed: gloo on CPU, NCCL on CUDA",
    ),
    _Option(
        "enforce_eager",
        _bool,
        "on CUDA: run every step eagerly (default: decode steps replay CUDA graphs captured at "
        "start-up per batch-size bucket)",
        flag_is_switch=True,
    ),
    _Option(
        "batch_invariant",
        _bool,
        "on CUDA: every linear through one fixed-tile GEMM, so a greedy or seeded request's "
        "tokens do not depend on what else runs (default off there: cuBLAS's tuned GEMMs are "
        "faster); CPU steps are batch-invariant by default",
        flag_is_switch=True,
    ),
    _Option(
        "speculative",
        str,
        "speculative decoding, outputs unchanged: ngram (prompt lookup: what followed the "
        "latest earlier occurrence of the last tokens) | draft (a smaller model's greedy "
        "continuation, --speculative-model)",
    ),
    _Option("num_speculative_tokens", int, "tokens proposed per step with --speculative (4)"),
    _Option("speculative_ngram_min", int, "shortest n-gram --speculative ngram matches (1)"),
    _Option("speculative_ngram_max", int, "longest n-gram --speculative ngram matches (4)"),
    _Option("speculative_model", str, "the draft model (--speculative draft)"),
    _Option(
        "shutdown_timeout",
        _non_negative_float,
        "seconds in-flight requests get after SIGTERM (0: abort them at once)",
    ),
    _Option("request_timeout", _positive_float, "default per-request deadline in seconds"),
    _Option(
        "health_stall_timeout",
        _positive_float,
        "/health fails when no engine step ends for this long while work is pending",
    ),
    _Option("max_body_bytes", parse_size, "largest request body accepted (413 beyond)"),
    _Option(
        "max_header_bytes",
        parse_size,
        "largest total size of a request's header names and values (431 beyond)",
    ),
    _Option("max_headers", int, "most header fields one request may carry (431 beyond)"),
    _Option("public_routes", _words, "comma list of routes served without a key"),
    _Option(
        "allowed_origins",
        _origins,
        "browser origins allowed by CORS, e.g. https://app.example (repeatable or a comma list; "
        "* allows any; none: no CORS headers)",
        repeatable=True,
    ),
    _Option(
        "tool_call_parser",
        str,
        "format of the model's tool calls: auto (from the chat template) | hermes | "
        "llama3_json | mistral",
    ),
    _Option(
        "reasoning_parser",
        str,
        "split <think>...</think> into reasoning_content: auto (when the chat template uses "
        "<think>) | think (always) | none",
    ),
    _Option("log_level", str, "debug | info | warning | error"),
    _Option(
        "enable_fault_injection",
        _bool,
        "FOR TESTS ONLY: accept the `fault` request field (fail a request or kill the engine)",
        flag_is_switch=True,
    ),
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
    max_model_len: int | None = None
    block_size: int | None = None
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    target_itl_ms: float | None = None  # None: the engine's default; 0: no step-time target
    kv_cache_memory: int | None = None
    max_queued_requests: int | None = None
    disable_prefix_caching: bool = False
    disable_cpu_kernels: bool = False
    dequantize: bool = False
    tensor_parallel_size: int = 1
    enforce_eager: bool = False
    batch_invariant: bool = False
    speculative: str | None = None
    num_speculative_tokens: int | None = None
    speculative_ngram_min: int | None = None
    speculative_ngram_max: int | None = None
    speculative_model: str | None = None
    shutdown_timeout: float = 30.0
    request_timeout: float | None = None
    health_stall_timeout: float = 120.0
    max_body_bytes: int = 4 * 1024 * 1024
    max_header_bytes: int = 32 * 1024
    max_headers: int = 100
    public_routes: tuple[str, ...] = ("/health", "/ready", "/metrics")
    allowed_origins: tuple[str, ...] = ()  # each flag value parses to a tuple: flattened below
    tool_call_parser: str = "auto"
    reasoning_parser: str = "auto"
    log_level: str = "info"
    enable_fault_injection: bool = False

    def __post_init__(self) -> None:
        flat = tuple(
            origin
            for item in self.allowed_origins
            for origin in ((item,) if isinstance(item, str) else item)
        )
        object.__setattr__(self, "allowed_origins", flat)
        if not 0 <= self.port < 65536:
            raise ValueError(f"--port must be in [0, 65535], got {self.port}")
        if self.tensor_parallel_size < 1:
            raise ValueError(
                f"--tensor-parallel-size must be at least 1, got {self.tensor_parallel_size}"
            )
        if self.max_body_bytes < 1024:
            raise ValueError(f"--max-body-bytes must be at least 1KiB, got {self.max_body_bytes}")
        if not (self.shutdown_timeout >= 0 and math.isfinite(self.shutdown_timeout)):
            raise ValueError(f"--shutdown-timeout must be >= 0, got {self.shutdown_timeout}")
        if self.max_header_bytes < 1024:
            raise ValueError(
                f"--max-header-bytes must be at least 1KiB, got {self.max_header_bytes}"
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


def _from_env(option: _Option, raw: str) -> Any:
    try:
        if option.repeatable:
            return tuple(option.parse(w) for w in _words(raw))
        return option.parse(raw)
    except ValueError as exc:
        raise ValueError(f"{option.env} (or {option.flag}): {exc}") from None


def add_arguments(parser: argparse.ArgumentParser) -> None:
    defaults = {f.name: f.default for f in fields(Settings)}
    for option in OPTIONS:
        help_text = f"{option.help} [env {option.env}; default {defaults[option.dest]!r}]"
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
                option.flag, dest=option.dest, type=_argparse_type(option), help=help_text
            )


def _argparse_type(option: _Option) -> Callable[[str], Any]:
    def convert(text: str) -> Any:
        try:
            return option.parse(text)
        except ValueError as exc:  # argparse prints ArgumentTypeError's message as is
            raise argparse.ArgumentTypeError(str(exc)) from None

    convert.__name__ = option.dest
    return convert
