"""`tgserve serve`: build the engine config and the app, then run uvicorn with our own signals.

Contract: `add_arguments(parser)` declares the flags (server/settings.py); `run(args)` serves
until SIGTERM / SIGINT and ends the process with its exit code (on a machine of a multi-node
group that does not hold rank 0, `--node-rank` > 0 or torchrun's RANK > 0, it serves no HTTP:
its ranks follow rank 0's steps, engine.serve_follower_node, until rank 0 stops them): 0 after a graceful drain (or a
signal during start-up), 1 when the
model failed to load or the engine loop died (the app's `on_fatal`, given at construction,
sets a `FatalExit` the server polls: in-flight streams get their error events, then the process
exits so an orchestrator restarts it), 128 + the signal
number (130 SIGINT, 143 SIGTERM, as a shell reports a process killed by it) when a second
signal forced the exit. Bad settings raise ValueError / FileNotFoundError before anything starts.
`serve_engine(settings, engine_factory, admission_limit)` builds the app, serves it (tests
run it on a fake engine) and then ends the process with the exit code (`exit_now`: the logs
flushed, then `os._exit`, so a thread still inside native code — the model load or a kernel
build at start-up, a step cut short — is never finalized under, which aborted the process with
"terminate called without an active exception"; a kernel build's child kills itself when its
parent is gone, models/cpu_kernels/builder.py); `serve_app(app, settings, fatal)` is the
uvicorn part alone, and returns.

Shutdown: the first SIGTERM or SIGINT makes /ready answer 503 and new requests 503, gives
in-flight requests `--shutdown-timeout` seconds (0: none), aborts what is left (open streams end with a
final `finish_reason: "abort"` chunk and `[DONE]`), then stops uvicorn. A second signal during
the drain forces the exit at once (as uvicorn and vLLM do): the process ends from the signal
handler (`exit_now`), open connections are cut by the kernel, nothing more is waited for and
no task is cancelled (so no traceback is logged). uvicorn's own handlers are not installed: they would re-raise the signal.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import re
import signal
import sys
import threading
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, NoReturn

import uvicorn

from server import settings as settings_module
from server.app import ServerState, create_app
from server.connections import uvicorn_options
from server.request_id import RequestIdLogFilter
from server.settings import Settings

logger = logging.getLogger("tgserve.serve")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    settings_module.add_arguments(parser)


def run(args: argparse.Namespace) -> NoReturn:
    from engine import EngineConfig, KVTierConfig, LoraConfig, kv_tier_config, speculative_config

    settings = Settings.resolve(args, os.environ)
    if settings.model is not None and not Path(settings.model).exists():
        raise FileNotFoundError(missing_model_message(settings.model))
    cluster = cluster_of(settings, os.environ)
    if not cluster.is_leader:  # another machine's ranks: no HTTP, rank 0's settings
        import engine

        configure_logging(settings.log_level)
        exit_now(engine.serve_follower_node(settings.model, cluster))
    tensor_parallel_size, stages = settings.tensor_parallel_size, settings.pipeline_parallel_size
    if cluster.world_size is not None and tensor_parallel_size == 1:  # torchrun's WORLD_SIZE
        tensor_parallel_size = max(1, cluster.world_size // stages)
    if cluster.world_size not in (None, tensor_parallel_size * stages):
        raise ValueError(
            f"--tensor-parallel-size {tensor_parallel_size} x --pipeline-parallel-size {stages} "
            f"differs from torchrun's WORLD_SIZE {cluster.world_size} (one process per rank)"
        )
    values = {
        "block_size": settings.block_size,
        "max_num_seqs": settings.max_num_seqs,
        "max_num_batched_tokens": settings.max_num_batched_tokens,
        "max_model_len": settings.max_model_len,
        "dtype": settings.dtype,
        "device": settings.device,
        "quantization": None if settings.quantization in (None, "none") else settings.quantization,
        "activation_quantization": None
        if settings.activation_quantization in (None, "none")
        else settings.activation_quantization,
        "kv_cache_dtype": settings.kv_cache_dtype,
        "kv_cache_memory_bytes": settings.kv_cache_memory,
        "max_queued_requests": settings.max_queued_requests,
        "grammar_cache_bytes": settings.grammar_cache_bytes,
        "target_itl_ms": settings.target_itl_ms,
        "enable_prefix_caching": not settings.disable_prefix_caching,
        "cpu_kernels": not settings.disable_cpu_kernels,
        "cpu_kernels_background": True,  # answer at once on PyTorch ops while they build
        "dequantize": settings.dequantize,
        "tensor_parallel_size": tensor_parallel_size,
        "pipeline_parallel_size": stages,
        "enforce_eager": settings.enforce_eager,
        "batch_invariant": settings.batch_invariant,
        "kv_tiers": kv_tier_config(  # a --role server's RAM tier holds the blocks it sends
            settings.kv_offload_ram_bytes, settings.kv_offload_dir, settings.kv_offload_bytes
        )
        or (KVTierConfig() if settings.role else None),
        "speculative": speculative_config(
            settings.speculative,
            settings.num_speculative_tokens,
            settings.speculative_ngram_min,
            settings.speculative_ngram_max,
            settings.speculative_model,
        ),
    }
    if settings.lora or settings.max_loras or settings.enable_lora_runtime_updates:
        values["lora"] = LoraConfig(
            adapters=settings.lora,
            max_loras=settings.max_loras,
            max_lora_rank=settings.max_lora_rank or 16,
            runtime_updates=settings.enable_lora_runtime_updates,
        )
    values = {k: v for k, v in values.items() if v is not None}
    if settings.target_itl_ms == 0:  # off: steps sized by the token budget alone
        values["target_itl_ms"] = None
    config = EngineConfig(**values)

    def load_engine() -> Any:
        from engine import leader_engine

        logger.info("loading %s", settings.model or "the default model (SmolLM2-135M-Instruct)")
        engine = leader_engine(settings.model, config, cluster, progress=True)
        if settings.role is not None:  # prefill/decode: its K/V peer joins before ready
            from server.disagg import open_link

            open_link(settings, engine)
        return engine

    configure_logging(settings.log_level)
    return serve_engine(settings, load_engine, config.max_in_flight)  # the one admission rule


def cluster_of(settings: Settings, environ: Mapping[str, str]) -> Any:
    """The machines of the group (engine.Cluster): the flags, else torchrun's variables."""
    from engine import Cluster

    return Cluster.from_environ(
        {
            "nnodes": settings.nnodes,
            "node_rank": settings.node_rank,
            "master_addr": settings.master_addr,
            "master_port": settings.master_port,
            "init_timeout_s": settings.dist_init_timeout,
        },
        environ,
    )


# owner/name, as the Hugging Face hub spells a repository id
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*$")


def missing_model_message(model: str) -> str:
    """Why --model cannot be served, and, for what looks like a hub id, how to get the files
    (tgserve downloads nothing at run time)."""
    if not _HUB_ID.match(model):
        return f"--model {model!r} does not exist; give an HF folder or a GGUF file"
    folder = "models/" + model.rsplit("/", 1)[1]
    return (
        f"--model {model!r} is not a folder or file here; if it is a Hugging Face hub id, "
        "tgserve downloads nothing: fetch the folder first, e.g. "
        f"`pip install huggingface_hub && hf download {model} --local-dir {folder}`, "
        f"then serve it with --model {folder}"
    )


def serve_engine(
    settings: Settings, engine_factory: Callable[[], Any], admission_limit: int
) -> NoReturn:
    """The app on this engine, served until a signal or a fatal engine error; then the process
    ends with the exit code (module docstring)."""
    fatal = FatalExit()
    app = create_app(settings, engine_factory, admission_limit, on_fatal=fatal.set)
    exit_now(serve_app(app, settings, fatal))


def exit_now(code: int) -> NoReturn:
    """Ends the process with `code` now: logs and standard streams flushed, no finalization."""
    logging.shutdown()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def configure_logging(level: str) -> None:
    """Log lines written while a request is handled name it (server/request_id.py)."""
    handler = logging.StreamHandler()
    handler.addFilter(RequestIdLogFilter())
    handler.setFormatter(
        logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(request)s%(message)s")
    )
    logging.basicConfig(level=level.upper(), handlers=[handler])


class FatalExit:
    """Set (on the event loop) when the model failed to load or the engine loop died; the
    server sees it at its next tick (0.1 s) and exits with code 1."""

    def __init__(self) -> None:
        self.is_set = False

    def set(self) -> None:
        self.is_set = True


def serve_app(app: Any, settings: Settings, fatal: FatalExit | None = None) -> int:
    """`fatal`: the FatalExit given to the app's `on_fatal` (none: fatal errors never stop it)."""
    config = uvicorn.Config(
        app,
        host=settings.host,
        port=settings.port,
        log_config=None,  # our logging configuration; uvicorn's loggers propagate to it
        log_level=settings.log_level.lower(),
        timeout_graceful_shutdown=5,  # streams have ended by then: the drain ran first
        # h11 refuses (400, connection closed) a header section larger than this before the
        # guard sees it; the slack leaves the guard's 431 as the limit users meet.
        h11_max_incomplete_event_size=h11_header_bound(settings),
        **uvicorn_options(settings, app.state.tgserve.metrics.reject),  # server/connections.py
    )
    server = _Server(config, app.state.tgserve, settings, fatal or FatalExit())
    asyncio.run(server.serve())
    return server.exit_code


def h11_header_bound(settings: Settings) -> int:
    """Bytes of a whole header section on the wire: request line, names, values, separators."""
    return settings.max_header_bytes + 4 * settings.max_headers + 16 * 1024


def exposure_warning(settings: Settings) -> str | None:
    """What to warn about when every interface is served and no key is asked for."""
    if settings.api_key or settings.host not in ("0.0.0.0", "::", ""):
        return None
    return (
        f"serving on every interface ({settings.host or 'all'}) without an API key: anyone who "
        "can reach this port can generate; give --api-key, or --host 127.0.0.1 for local use"
    )


class _Server(uvicorn.Server):
    def __init__(
        self, config: uvicorn.Config, state: ServerState, settings: Settings, fatal: FatalExit
    ) -> None:
        super().__init__(config)
        self.state = state
        self.settings = settings
        self.fatal = fatal
        self.exit_code = 0
        self._draining: asyncio.Task[None] | None = None

    async def on_tick(self, counter: int) -> bool:
        if self.fatal.is_set and self.exit_code == 0:
            self.exit_code = 1
        return self.fatal.is_set or await super().on_tick(counter)

    async def startup(self, sockets: Any = None) -> None:
        await super().startup(sockets)
        auth = f"{len(self.settings.api_key)} API key(s)" if self.settings.api_key else "no API key"
        logger.info("listening on http://%s:%d (%s)", self.config.host, self.config.port, auth)
        warning = exposure_warning(self.settings)
        if warning is not None:
            logger.warning(warning)

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        if threading.current_thread() is not threading.main_thread():
            yield
            return
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGINT, signal.SIGTERM):
            loop.add_signal_handler(sig, self._on_signal, sig)
        try:
            yield
        finally:
            for sig in (signal.SIGINT, signal.SIGTERM):
                loop.remove_signal_handler(sig)

    def _on_signal(self, sig: signal.Signals) -> None:
        if self._draining is not None:
            logger.warning("%s again: exiting now, cutting in-flight requests", sig.name)
            exit_now(128 + int(sig))
        timeout = self.settings.shutdown_timeout
        logger.info("%s: draining (up to %.0fs for in-flight requests)", sig.name, timeout)
        self._draining = asyncio.get_running_loop().create_task(self._drain(timeout))

    async def _drain(self, timeout: float) -> None:
        try:
            await self.state.drain(timeout)
        finally:
            self.should_exit = True
