"""Serving on PyTorch ops while the C++ CPU kernels build, then switching to them between
requests.

Why: a cold build of models/cpu_kernels takes 1-2 minutes on 2 cores, and a first `tgserve
serve` must answer within seconds (issue 25). So when the kernels are not built yet, the model
runner starts on the PyTorch path and this builds the kernels (a child process at low CPU
priority: requests served meanwhile come first) and then the forward path they give, in a
daemon thread.

Contract: `PendingKernelPath(build_path)` starts that thread; `build_path()` is called once the
kernels are loaded and returns what to switch to: the model the kernels run (the same one, or
for a GGUF file its blocks as stored, loaded then: the PyTorch path ran its dequantised copy)
and its forward path (models/forward_path with the kernels asked for). `take()` returns that
pair once it is ready (None before, and for good when the kernels could not be built: the
PyTorch path then stays). The engine switches only at a step
where no request has started (`Engine.step`): the PyTorch path and the kernel path agree to
float rounding, not bit for bit, so a request runs on one path from its first token to its
last, and the prefix cache is emptied at the switch (its K/V came from the other path).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from torch import nn

from models import cpu_kernels
from models.forward_path import ForwardPath

KernelPath = tuple[nn.Module, ForwardPath]  # the model the kernels run, and its forward path

log = logging.getLogger("tgserve.engine")

BUILD_NICENESS = 10  # the compiler yields the CPU to the requests served meanwhile


class PendingKernelPath:
    def __init__(self, build_path: Callable[[], KernelPath]) -> None:
        self._build_path = build_path
        self._started = time.monotonic()
        self._path: KernelPath | None = None
        self._done = threading.Event()
        self._taken = False
        log.info(
            "C++ CPU kernels not built yet: serving on PyTorch ops while they build "
            "(progress below); steps switch to them between requests once they load"
        )
        threading.Thread(target=self._build, name="tgserve-kernels", daemon=True).start()

    def _build(self) -> None:
        try:
            if cpu_kernels.extension(niceness=BUILD_NICENESS) is not None:
                self._path = self._build_path()
                log.info(
                    "C++ CPU kernels loaded after %.0f s; switching to them at the next step "
                    "with no request in flight",
                    time.monotonic() - self._started,
                )
        except Exception:  # the PyTorch path serves on; the failure is no request's
            log.exception("preparing the C++ kernel path failed; PyTorch ops serve on")
        finally:
            self._done.set()

    @property
    def ready(self) -> bool:
        """True once the kernel path is built and waits to be taken."""
        return self._done.is_set() and self._path is not None and not self._taken

    @property
    def settled(self) -> bool:
        """True once `take()` can no longer return a path (taken, or the build failed)."""
        return self._taken or (self._done.is_set() and self._path is None)

    def take(self) -> KernelPath | None:
        if self._taken or not self._done.is_set() or self._path is None:
            return None
        self._taken = True
        return self._path
