"""A Docker daemon and an offline-built base image for the container test.

No image registry is reachable from these machines, so the test cannot pull `python:3.11-slim`.
Instead `base_image()` builds a Debian bookworm root file system from Debian packages with
mmdebstrap (Python 3.11, venv, headers, g++), with the host's CA bundle in place of Debian's (a
build reaches the package index only through it), and `docker import`s it under a tag keyed by
its recipe and that bundle, so later runs on the same machine reuse it (~1-3 minutes saved).
`wheel_index()` serves pip's configured find-links folder (the local CPU torch wheel) over HTTP
on loopback as a simple package index (one page per project), for a build run with
`--network host`: the Dockerfile's TORCH_INDEX_URL in place of PyTorch's CPU index.
`build_image()` builds the repository's Dockerfile on that base, as the tests build it
(tests/deploy/image_prebuild.py starts the container test's build in the background, on idle CPU;
`stop_builds()` cancels the builds under way).

`ensure_tools()` installs Debian's docker.io, mmdebstrap and docker-compose with apt-get (as root)
where they are missing; `ensure_docker()` then starts dockerd when `docker info` fails.
Anything that stops it fails the test loudly: the container test is never skipped.
"""

from __future__ import annotations

import functools
import hashlib
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

BASE_PACKAGES = "python3,python3-venv,python3-pip,python3-dev,python-is-python3,g++,ca-certificates"
HOST_CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
APT_SOURCES = (Path("/etc/apt/sources.list.d/debian.sources"), Path("/etc/apt/sources.list"))
TOOLS = {
    "docker": "docker.io",
    "dockerd": "docker.io",
    "mmdebstrap": "mmdebstrap",
    "docker-compose": "docker-compose",  # v1, to validate deploy/docker-compose.yml
}
ROOT = Path(__file__).resolve().parents[2]
# The index's URL is a build argument, part of Docker's cache key for every later step: a fixed
# port keeps it, and so the cached layers, from one run to the next.
WHEEL_PORT = 38617
DOCKERD_LOG = Path(tempfile.gettempdir()) / "tgserve-test-dockerd.log"


def run(*args: str, timeout: float = 120, check: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=timeout)
    if check and done.returncode != 0:
        pytest.fail(f"{' '.join(args)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    return done


def _docker_answers() -> bool:
    return shutil.which("docker") is not None and run("docker", "info", check=False).returncode == 0


@functools.cache
def ensure_tools() -> None:
    """Installs the missing Debian packages of TOOLS, or fails saying which are missing."""
    missing = sorted({package for tool, package in TOOLS.items() if shutil.which(tool) is None})
    if missing:
        if os.geteuid() != 0 or shutil.which("apt-get") is None:
            pytest.fail(f"the deploy tests need Debian's {' '.join(missing)} (apt-get install)")
        run("apt-get", "update", "-qq", timeout=600)
        run("apt-get", "install", "-y", "-qq", *missing, timeout=900)


@functools.cache
def ensure_docker() -> None:
    ensure_tools()
    if _docker_answers():
        return
    with DOCKERD_LOG.open("ab") as log:  # the daemon outlives the test run, like a service
        subprocess.Popen(["dockerd"], stdout=log, stderr=log, start_new_session=True)
    deadline = time.monotonic() + 60
    while not _docker_answers():
        if time.monotonic() > deadline:
            pytest.fail(f"dockerd did not start; its log:\n{DOCKERD_LOG.read_text()[-3000:]}")
        time.sleep(1)


def base_image(cgroup: Path | None = None) -> str:
    """The tag of the imported Debian base, built the first time on this machine (with `cgroup`,
    mmdebstrap runs inside that cpu cgroup)."""
    recipe = f"bookworm {BASE_PACKAGES}".encode() + HOST_CA_BUNDLE.read_bytes()
    tag = f"tgserve-test-base:bookworm-{hashlib.sha1(recipe).hexdigest()[:12]}"
    if run("docker", "image", "inspect", tag, check=False).returncode == 0:
        return tag
    sources = [str(p) for p in APT_SOURCES if p.exists()][:1]  # the host's Debian mirror
    # The shell joins the cgroup, then becomes mmdebstrap (same PID); its children follow.
    inside = ["sh", "-c", 'echo $$ > "$0" && exec "$@"', f"{cgroup}/cgroup.procs"] if cgroup else []
    with tempfile.TemporaryDirectory() as tmp:
        tar = str(Path(tmp) / "base.tar")
        run(
            *inside, "mmdebstrap", "--variant=apt",
            f"--include={BASE_PACKAGES}",
            f"--customize-hook=upload {HOST_CA_BUNDLE} /etc/ssl/certs/ca-certificates.crt",
            "bookworm", tar, *sources, timeout=900,
        )  # fmt: skip
        run("docker", "import", tar, tag, timeout=300)
    return tag


_building: set[subprocess.Popen] = set()  # the docker clients of the builds under way


def build_image(tag: str, *build_args: str, cgroup: Path | None = None) -> float:
    """`docker build` of the repository's Dockerfile on the offline base, with `build_args`
    (`--build-arg NAME=VALUE` pairs, or other `docker build` flags); returns the seconds it took.
    `cgroup`: the cpu cgroup the base's mmdebstrap runs in (the build's steps: --cgroup-parent)."""
    started = time.monotonic()
    command = [
        "docker", "build", "--network", "host", "--build-arg", f"BASE_IMAGE={base_image(cgroup)}",
        *build_args, "-t", tag, str(ROOT),
    ]  # fmt: skip
    child = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _building.add(child)
    try:
        _, stderr = child.communicate(timeout=3600)
    except subprocess.TimeoutExpired:
        child.kill()
        _, stderr = child.communicate()
        stderr += "\n(killed: the build took over an hour)"
    finally:
        _building.discard(child)
    if child.returncode != 0:
        pytest.fail(f"{' '.join(command)} exited {child.returncode}:\n{stderr[-3000:]}")
    return time.monotonic() - started


def stop_builds() -> None:
    """Kills the docker clients of the builds under way: Docker cancels a build whose client
    went away (its step's container is removed)."""
    for child in list(_building):
        child.kill()


def find_links() -> Path | None:
    """pip's configured find-links folder, where the local CPU torch wheel lies (if any)."""
    listing = run(sys.executable, "-m", "pip", "config", "list").stdout
    for line in listing.splitlines():
        key, _, value = line.partition("=")
        if key.endswith("find-links") and Path(value.strip("'\"")).is_dir():
            return Path(value.strip("'\""))
    return None


@contextmanager
def wheel_index(folder: Path) -> Iterator[str]:
    """A PEP 503 index of the wheels in `folder`, served on loopback: `<url><project>/` lists
    that project's wheels (Python's directory listing; pip reads it as an index page)."""
    with tempfile.TemporaryDirectory() as root:
        for wheel in folder.glob("*.whl"):
            project = Path(root) / wheel.name.split("-")[0].lower().replace("_", "-")
            project.mkdir(exist_ok=True)
            (project / wheel.name).symlink_to(wheel)

        class Quiet(http.server.SimpleHTTPRequestHandler):
            def __init__(self, *args, **kwargs) -> None:
                super().__init__(*args, directory=root, **kwargs)

            def log_message(self, *args) -> None:
                pass

        try:
            server = http.server.ThreadingHTTPServer(("127.0.0.1", WHEEL_PORT), Quiet)
        except OSError:  # taken: any port (the layers from the torch install on are rebuilt)
            server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Quiet)
        thread = threading.Thread(target=server.serve_forever, daemon=True)
        thread.start()
        try:
            yield f"http://127.0.0.1:{server.server_port}/"
        finally:
            server.shutdown()
            server.server_close()


def compose_config_errors(path: Path) -> str:
    """What docker-compose's own `config` check says against the file ("" when it is valid)."""
    ensure_tools()
    check = subprocess.run(
        ["docker-compose", "-f", str(path), "config", "-q"], capture_output=True, text=True
    )
    return "" if check.returncode == 0 else check.stderr or "invalid"
