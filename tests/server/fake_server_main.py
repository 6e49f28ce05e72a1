"""The real `serve_engine` (uvicorn with tgserve's signal handling) on the fake engine, as a
process the shutdown tests can signal:

    python -m tests.server.fake_server_main PORT SHUTDOWN_TIMEOUT STEP_DELAY [FLAG...]

Further arguments are more `tgserve serve` flags (e.g. --enable-fault-injection).
"""

from __future__ import annotations

import argparse
import sys

from server.serve import add_arguments, configure_logging, serve_engine
from server.settings import Settings
from tests.server.fake_engine import FakeEngine


def main() -> int:
    port, shutdown_timeout, step_delay = sys.argv[1], sys.argv[2], float(sys.argv[3])
    parser = argparse.ArgumentParser()
    add_arguments(parser)  # the timeout goes through the CLI's own parsing and validation
    flags = ["--host", "127.0.0.1", "--port", port, "--shutdown-timeout", shutdown_timeout]
    flags += sys.argv[4:]
    settings = Settings.resolve(parser.parse_args(flags), {})
    configure_logging("info")
    return serve_engine(
        settings, lambda: FakeEngine(step_delay=step_delay, max_model_len=4096), admission_limit=16
    )


if __name__ == "__main__":
    sys.exit(main())
