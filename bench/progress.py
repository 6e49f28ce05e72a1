"""A one-line progress bar on stderr while a benchmark runs (stdout stays for the results).

Contract: `ProgressBar(label, total, enabled)`; `update(done)` redraws `label [####....] done/total`
in place (carriage return, no newline) and `close()` ends the line. Disabled bars print nothing,
so `--json` output piped to a file and tests stay clean. `enabled_by_default()` is True when
stderr is a terminal (the tqdm convention).
"""

from __future__ import annotations

import sys
import time
from typing import TextIO

WIDTH = 30


def enabled_by_default() -> bool:
    return sys.stderr.isatty()


class ProgressBar:
    def __init__(self, label: str, total: int, enabled: bool, stream: TextIO | None = None) -> None:
        self.label = label
        self.total = max(total, 1)
        self.enabled = enabled
        self._stream = stream or sys.stderr
        self._start = time.perf_counter()
        self._drawn = False
        if enabled:
            self.update(0)

    def update(self, done: int) -> None:
        if not self.enabled:
            return
        filled = min(WIDTH, WIDTH * done // self.total)
        elapsed = time.perf_counter() - self._start
        bar = "#" * filled + "." * (WIDTH - filled)
        self._stream.write(f"\r{self.label} [{bar}] {done}/{self.total} {elapsed:6.1f}s")
        self._stream.flush()
        self._drawn = True

    def close(self) -> None:
        if self.enabled and self._drawn:
            self._stream.write("\n")
            self._stream.flush()
            self._drawn = False

    def __enter__(self) -> ProgressBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
