"""The Triton experts' device: CPU tensors through the interpreter, or the GPU that
TGSERVE_TEST_DEVICE names (the attention kernels' fixtures)."""

from tests.models.triton_attention.conftest import cpu_triton, triton_kernels  # noqa: F401
