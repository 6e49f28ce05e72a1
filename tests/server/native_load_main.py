"""`serve_engine` whose model load never ends and keeps torch's native thread pool busy (as a
real load does: weights unpacked by torch ops), for the signal tests:

    python -m tests.server.native_load_main PORT

A process that ends while a thread is inside torch's native code must not abort ("terminate
called without an active exception"); /health answers meanwhile, /ready does not.
"""

from __future__ import annotations

import sys

import torch

from server.serve import configure_logging, serve_engine
from server.settings import Settings


def endless_load() -> None:
    a = torch.randn(512, 512)
    while True:  # the process ends around it
        a = torch.tanh(a @ a)


def main() -> int:
    configure_logging("info")
    torch.set_num_threads(2)
    settings = Settings(host="127.0.0.1", port=int(sys.argv[1]), shutdown_timeout=5.0)
    return serve_engine(settings, endless_load, admission_limit=4)


if __name__ == "__main__":
    sys.exit(main())
