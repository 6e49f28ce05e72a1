"""A live tgserve HTTP server on a free port, in a background thread, for the server tests.

`LiveServer(engine_factory, on_fatal=..., **settings)` is a context manager: it builds the app with
`create_app`, runs uvicorn in a thread, waits until /ready answers 200 and stops it on exit.
`free_port()` finds a port; `metric(text, name, labels)` reads one sample from /metrics text
through prometheus_client's parser; `inference_client(url, monkeypatch)` is huggingface_hub's
client for a live server.
"""

from __future__ import annotations

import socket
import threading
import time
from collections.abc import Callable
from typing import Any

import httpx
import uvicorn
from prometheus_client.parser import text_string_to_metric_families

from server.app import create_app
from server.connections import uvicorn_options
from server.serve import h11_header_bound
from server.settings import Settings


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    def __init__(
        self,
        engine_factory: Callable[[], Any],
        admission_limit: int = 32,
        wait_ready: bool = True,
        on_fatal: Callable[[], None] = lambda: None,
        span_exporter: Any = None,
        **settings: Any,
    ) -> None:
        self.port = free_port()
        self.settings = Settings(host="127.0.0.1", port=self.port, **settings)
        self.app = create_app(
            self.settings, engine_factory, admission_limit, on_fatal, span_exporter
        )
        self.state = self.app.state.tgserve
        self.url = f"http://127.0.0.1:{self.port}"
        self._wait_ready = wait_ready
        config = uvicorn.Config(
            self.app,
            host="127.0.0.1",
            port=self.port,
            log_level="warning",
            timeout_graceful_shutdown=2,
            h11_max_incomplete_event_size=h11_header_bound(self.settings),  # as serve_app does
            **uvicorn_options(self.settings, self.state.metrics.reject),
        )
        self.server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self.server.run, daemon=True)

    def __enter__(self) -> LiveServer:
        self._thread.start()
        deadline = time.monotonic() + 240  # a cold build of the C++ kernels takes ~1 min
        while not self.server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError("the test server did not start")
            time.sleep(0.01)
        auth = (
            {"Authorization": f"Bearer {self.settings.api_key[0]}"} if self.settings.api_key else {}
        )
        while self._wait_ready and httpx.get(self.url + "/ready", headers=auth).status_code != 200:
            if time.monotonic() > deadline:
                raise RuntimeError("the test server never became ready")
            time.sleep(0.02)
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.should_exit = True
        self._thread.join(15)


def metric(text: str, name: str, labels: dict[str, str] | None = None) -> float:
    """The value of sample `name` (with exactly these labels) in Prometheus text."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == (labels or {}):
                return sample.value
    raise KeyError(f"no sample {name} {labels or ''} in /metrics")


def inference_client(url: str, monkeypatch: Any, timeout: float = 20) -> Any:
    """huggingface_hub's InferenceClient on `url`; it refuses to connect at all in offline mode,
    even to a local URL, so the test lifts that mode (through pytest's `monkeypatch`)."""
    import huggingface_hub.constants

    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", False)
    return huggingface_hub.InferenceClient(model=url, timeout=timeout)
