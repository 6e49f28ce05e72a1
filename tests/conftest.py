"""Fixtures shared by the test packages: the tiny model folder (server, deploy), the device
the model / attention / engine / fidelity tests run on (`TGSERVE_TEST_DEVICE`, tests/devices.py),
Triton's interpreter for CPU runs, the hypothesis profile (`TGSERVE_HYPOTHESIS_PROFILE`), and
the C++ kernel builds a broad run starts ahead of need (tests/kernel_prebuild.py), the container
test's image, built in the background while the rest runs (tests/deploy/image_prebuild.py), and
transformers' load of the default model's GGUF, made once for the modules that compare with it.

Triton decides when a module is imported whether its kernels (and triton.language's own
helpers) are interpreted, so TRITON_INTERPRET=1 is set here, before anything imports triton,
unless the tests run on a GPU (TGSERVE_TEST_DEVICE=cuda): the Triton kernels'
tests (tests/models/triton_attention) then run on CPU tensors in the interpreter.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path

if os.environ.get("TGSERVE_TEST_DEVICE", "cpu") == "cpu":
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from hypothesis import HealthCheck, settings  # noqa: E402

import models  # noqa: E402, F401
from tests.property_budget import PROFILE  # noqa: E402
from tests.server.tiny_model import make_tiny_model  # noqa: E402

# TGSERVE_HYPOTHESIS_PROFILE=ci (.ci/run): no deadlines or too-slow checks on a shared machine;
# the slowest property tests also draw fewer examples there (tests/property_budget.py).
settings.register_profile("ci", deadline=None, suppress_health_check=[HealthCheck.too_slow])
settings.load_profile(PROFILE)

# oneDNN takes its ISA cap once, at its first primitive: take it now, under the cap `import
# models` sets on AMX CPUs (models/linear_backend.py), as a serving process does. Otherwise the
# first bfloat16 GEMM of the run could come after a bench test lifted the cap for its
# in-process peers (release_onednn_isa), and every later test would run the AMX kernels.
torch.nn.functional.linear(
    torch.zeros(8, 64, dtype=torch.bfloat16), torch.zeros(64, 64, dtype=torch.bfloat16)
)


@pytest.fixture(scope="session")
def tiny_model_folder(tmp_path_factory):
    """A tiny random Llama + trained BPE tokenizer folder, made once per session."""
    return make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny")


@pytest.fixture(scope="session")
def smollm2_transformers_saved(tmp_path_factory) -> Iterator[Path]:
    """transformers' own load of the default model's GGUF (its dequantisation to float32, the
    oracle of tests/models/gguf/test_smollm2*.py and the end-to-end test), done once per session
    and saved whole with torch.save (the same module, tensors bit for bit, tied weights tied;
    transformers refuses save_pretrained for a GGUF load): the `smollm2_transformers` fixture
    reloads it in a second, where each module redid the GGUF load (~15 s). The 538 MB file is
    removed at the session's end."""
    import torch
    import transformers

    from tests.devices import default_model_here

    path = default_model_here()
    saved = tmp_path_factory.mktemp("smollm2-transformers") / "model.pt"
    model = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    )
    torch.save(model.eval(), saved)
    del model
    yield saved
    shutil.rmtree(saved.parent, ignore_errors=True)


@pytest.fixture(scope="module")
def smollm2_transformers(smollm2_transformers_saved: Path):
    """transformers' float32 load of the default model's GGUF (see the saved file's fixture), in
    eval mode; one per module, freed after it."""
    import torch

    return torch.load(smollm2_transformers_saved, weights_only=False)


@pytest.fixture(scope="session")
def device():
    """`torch.device` from TGSERVE_TEST_DEVICE (default cpu); see tests/devices.py."""
    from tests.devices import selected_device  # torch only for the tests that ask

    return selected_device()


def pytest_sessionstart(session: pytest.Session) -> None:
    from tests import kernel_prebuild

    kernel_prebuild.start_native_if_whole_suite(session.config)


@pytest.hookimpl(trylast=True)  # after -k / -m deselection
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """The tests that need the container image run last: its build overlaps everything else."""
    from tests.deploy import image_prebuild

    image_prebuild.order_last(items)


def pytest_collection_finish(session: pytest.Session) -> None:
    """A broad run starts the C++ kernel builds its tests need in the background now, so they
    overlap the tests before them (tests/kernel_prebuild.py); a run with the container test
    starts its image build, on idle CPU (tests/deploy/image_prebuild.py)."""
    from tests import kernel_prebuild
    from tests.deploy import image_prebuild

    modules = (getattr(item, "module", None) for item in session.items)
    kernel_prebuild.start(modules, len(session.items))
    image_prebuild.start(session.items, session.config)


def pytest_sessionfinish() -> None:
    """An image build still under way (the run stopped early) is cancelled."""
    from tests.deploy import image_prebuild

    image_prebuild.stop()


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Tests marked `cpu_kernels` (the C++ CPU kernels alone, on CPU tensors) skip with the reason
    when the tests run on another device: CI runs them on the CPU; a GPU run spends its minutes
    on what the device runs."""
    if item.get_closest_marker("cpu_kernels") is not None:
        from tests import devices

        if devices.selected_device().type != "cpu":
            pytest.skip(devices.CPU_KERNEL_TESTS)


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """TGSERVE_TEST_INSTAFAIL=1 (the GPU check's suite): print a failure's traceback the moment it
    comes in (xdist forwards reports to the controller, where this runs), so a suite cut off by
    its time budget still says why each failed test failed; pytest's own summary comes at the end.
    """
    if report.failed and os.environ.get("TGSERVE_TEST_INSTAFAIL") == "1":
        text = report.longreprtext
        if len(text) > 6000:  # the test's own lines and the assertion, not the middle
            text = f"{text[:2000]}\n[...]\n{text[-4000:]}"
        print(f"\n----- {report.nodeid} ({report.when})\n{text}\n", flush=True)
