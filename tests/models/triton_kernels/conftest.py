"""The Triton kernels' device: CPU tensors through the interpreter (TRITON_INTERPRET=1, set by
tests/conftest.py), or the GPU that TGSERVE_TEST_DEVICE names (the same fixture as the
attention kernels')."""

from tests.models.triton_attention.conftest import triton_kernels  # noqa: F401
