"""The forward-path seam (models/forward_path.py): which backend serves which model, device
and flags, what the engine's start-up log says, and that every path it returns computes what
the model's own forward does."""

from __future__ import annotations

import pytest
import torch

from models import forward_path
from models.attention import AttentionMetadata
from models.forward_path import BACKENDS_BY_DEVICE, BUILDERS, select_forward_path
from models.quantization import quantize_int8_weight_only
from tests.checkpoints import make_hf_model
from tests.models.paged_driver import PagedDriver
from tests.models.test_fused_decoder import ours_from

CPU = torch.device("cpu")
CPP_STEP = "forward steps by tgserve's C++ CPU kernels"
CPP_ATTENTION = "PyTorch layers with tgserve's C++ paged attention"
PYTORCH = "PyTorch ops only"
TRITON = "PyTorch layers with tgserve's Triton paged attention"


def _path(arch: str, cpu_kernels: bool, device: torch.device = CPU, int8: bool = False):
    model = ours_from(make_hf_model(arch), torch.float32)
    if int8:
        quantize_int8_weight_only(model)
    return select_forward_path(model, PagedDriver(model).kv, device, cpu_kernels=cpu_kernels)


@pytest.mark.parametrize(
    "arch,cpu_kernels,int8,description",
    [
        ("llama", True, False, CPP_STEP),
        ("qwen2", True, False, CPP_STEP),
        ("gpt2", True, False, CPP_ATTENTION),  # not a model the C++ step runs
        ("llama", True, True, CPP_ATTENTION),  # int8 linears keep their PyTorch kernel
        ("llama", False, False, PYTORCH),
        ("gpt2", False, False, PYTORCH),
    ],
)
def test_the_best_backend_that_serves_the_model_is_chosen(
    arch: str, cpu_kernels: bool, int8: bool, description: str
) -> None:
    path = _path(arch, cpu_kernels, int8=int8)
    assert path.description == description
    assert path.attention_kernel == (description != PYTORCH)


def test_kernels_that_cannot_be_built_leave_plain_pytorch(monkeypatch) -> None:
    monkeypatch.setattr(forward_path, "cpu_kernels_ready", lambda device: False)
    assert _path("llama", cpu_kernels=True).description == PYTORCH


def test_a_device_without_registered_backends_runs_the_models_own_forward() -> None:
    path = _path("llama", cpu_kernels=True, device=torch.device("meta"))
    assert path.description == PYTORCH and not path.attention_kernel


def test_cuda_runs_the_triton_attention(monkeypatch) -> None:
    # chosen without touching a GPU; what the path computes: tests/models/triton_attention
    cuda = torch.device("cuda")
    for arch in ("llama", "gpt2"):
        path = _path(arch, cpu_kernels=True, device=cuda)
        assert path.description == TRITON and not path.attention_kernel
    monkeypatch.setattr(forward_path.triton_attention, "is_available", lambda: False)
    assert _path("llama", cpu_kernels=True, device=cuda).description == PYTORCH


@pytest.mark.parametrize("batch_invariant", [False, True])
def test_split_decode_attention_is_off_where_batch_invariance_is_promised(batch_invariant):
    model = ours_from(make_hf_model("llama"), torch.float32)
    path = select_forward_path(
        model,
        PagedDriver(model).kv,
        torch.device("cuda"),
        cpu_kernels=False,
        batch_invariant=batch_invariant,
    )
    assert path.description.startswith(TRITON)
    assert path.attention.split_decode is not batch_invariant


def test_every_listed_backend_has_a_builder() -> None:
    for names in BACKENDS_BY_DEVICE.values():
        assert all(name in BUILDERS for name in names)


@pytest.mark.parametrize("cpu_kernels", [True, False])
def test_every_path_computes_what_the_model_computes(cpu_kernels: bool) -> None:
    model = ours_from(make_hf_model("llama"), torch.float32)
    eager, fast = PagedDriver(model, block_size=4), PagedDriver(model, block_size=4)
    path = select_forward_path(model, fast.kv, CPU, cpu_kernels=cpu_kernels)
    ids, positions = torch.arange(3, 10), torch.arange(7)
    with torch.inference_mode():
        for driver in (eager, fast):
            if driver is eager:
                meta = AttentionMetadata.build([[5, 2]], [7], [7], 4)
                want = model.compute_logits(model(ids, positions, meta, eager.kv))
            else:  # the path's own backend builds its metadata (its kernel, its plan)
                meta = path.attention.build([[5, 2]], [7], [7])
                got = path.logits(path.hidden(ids, positions, meta))
    torch.testing.assert_close(got, want, atol=1e-4, rtol=0)
    for (k_want, v_want), (k_got, v_got) in zip(eager.kv, fast.kv, strict=True):
        torch.testing.assert_close(k_got, k_want, atol=1e-5, rtol=0)
        torch.testing.assert_close(v_got, v_want, atol=1e-5, rtol=0)
