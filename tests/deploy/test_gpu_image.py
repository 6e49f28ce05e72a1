"""The GPU variant of the image (`--build-arg VARIANT=cuda`) builds from the same Dockerfile.

The CUDA build runs only when TGSERVE_TEST_GPU_IMAGE=1 (CUDA torch is gigabytes of wheels from
the default index); otherwise it is skipped, saying so. Oracles, read inside the built image:
torch is a CUDA build (`torch.version.cuda` is set), no C++ CPU kernel was built (the extension
folder is empty), a C compiler is there for Triton's launcher, and `tgserve serve --help`
answers without a GPU. An unknown VARIANT fails the build at its first step, naming the
argument (cheap: always run). The GPU manifest's tag is checked in test_manifests.py.
"""

from __future__ import annotations

import os
import subprocess

import pytest

from tests.deploy.docker_host import ROOT, base_image, build_image, ensure_docker, run

GPU_IMAGE = "tgserve:gpu-test"


def test_an_unknown_variant_fails_the_build_naming_it():
    ensure_docker()
    build = subprocess.run(
        ["docker", "build", "--build-arg", f"BASE_IMAGE={base_image()}",
         "--build-arg", "VARIANT=rocm", "-t", "tgserve:bad-variant", str(ROOT)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert build.returncode != 0
    assert "VARIANT must be cpu or cuda, not 'rocm'" in build.stdout + build.stderr


@pytest.mark.skipif(
    os.environ.get("TGSERVE_TEST_GPU_IMAGE") != "1",
    reason="builds the CUDA variant (gigabytes of CUDA wheels): set TGSERVE_TEST_GPU_IMAGE=1",
)
def test_the_cuda_variant_has_cuda_torch_and_no_cpp_kernels():
    ensure_docker()
    seconds = build_image(GPU_IMAGE, "--build-arg", "VARIANT=cuda")
    print(f"\nGPU image built in {seconds:.0f} s")

    def inside(*command: str) -> str:
        return run("docker", "run", "--rm", "--entrypoint", command[0], GPU_IMAGE, *command[1:])

    cuda = inside("python", "-c", "import torch; print(torch.version.cuda)").stdout.strip()
    assert cuda not in ("", "None"), cuda
    assert inside("sh", "-c", 'ls -A "$TORCH_EXTENSIONS_DIR"').stdout.strip() == ""
    assert inside("sh", "-c", "command -v gcc").stdout.strip()
    assert "--model" in inside("tgserve", "serve", "--help").stdout
