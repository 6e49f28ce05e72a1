"""A signal during start-up ends `tgserve serve` within --shutdown-timeout, its kernel build too.

The server starts on a cold kernel cache of its own (TORCH_EXTENSIONS_DIR in the test's folder)
with a compiler that stays in its compile step (tests/models/slow_build.py), so the signal
surely comes while the C++ kernels compile. The process must exit in time (issue 26: it waited
for the build, or forever on a lock a killed build left) and no process of the build may
survive it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.models.slow_build import compiling_pids, pids_in_session, slow_compiler, wait_for
from tests.server.live import free_port

ROOT = Path(__file__).resolve().parents[2]
SHUTDOWN_TIMEOUT = 5.0


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
def test_a_signal_while_the_kernels_compile_ends_the_server_and_its_build(
    sig, tmp_path, tiny_model_folder
) -> None:
    compilers = tmp_path / "cc"
    env = {
        **os.environ,
        "CXX": str(slow_compiler(compilers)),
        "TORCH_EXTENSIONS_DIR": str(tmp_path / "extensions"),
    }
    command = [sys.executable, "-m", "server.cli", "serve", "--model", str(tiny_model_folder)]
    command += ["--port", str(free_port()), "--shutdown-timeout", str(SHUTDOWN_TIMEOUT)]
    server = subprocess.Popen(
        command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    try:
        wait_for(lambda: compiling_pids(compilers) or server.poll() is not None, 180, "a compile")
        assert server.poll() is None, server.stdout.read()
        session = os.getsid(compiling_pids(compilers)[0])
        signalled = time.monotonic()
        server.send_signal(sig)
        output, _ = server.communicate(timeout=60)
        took = time.monotonic() - signalled
    finally:
        server.kill()
    assert took <= SHUTDOWN_TIMEOUT, (took, output)
    assert server.returncode == 0, output
    wait_for(lambda: not pids_in_session(session), 5, "the build's processes to end")
