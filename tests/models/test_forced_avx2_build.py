"""The AVX2 build of the C++ kernels, forced as a user forces it (TGSERVE_CPU_ISA=avx2, read
when the kernels are first built or loaded), keeps the batch-invariance and fidelity guarantees
on any host that can run it, AVX-512 hosts included (where it is not the native build): CI runs
these on every x86 host, so an AVX2-only path cannot break unseen on an AVX-512 machine.

Each case is a test of the native build's suite run again with the forced build serving
`cpu_kernels.extension()`: the attention row alone vs in batches of 2..64 (both work splits),
the whole C++ step alone vs chunked beside other sequences (same logits and K/V bits), the
attention against its float64 reference, and the C++ step against transformers; and the same
over int8 K/V rows (`--kv-cache-dtype int8`) and a float32 model's float16 rows (`float16`: the
float32 bits over the rounded rows).
"""

from __future__ import annotations

import pytest
import torch

from models import cpu_kernels
from models.cpu_features import AVX2_FLAGS, cpu_flags
from tests.models import test_attention_prefetch as prefetch
from tests.models import test_cpu_kernel_invariance as invariance
from tests.models import test_cpu_paged_attention as attention
from tests.models import test_fused_decoder as fused
from tests.models import test_kv_half_attention as half_attention
from tests.models import test_kv_half_model as half_model
from tests.models import test_kv_int8_attention as int8_attention
from tests.models import test_kv_int8_model as int8_model

pytestmark = [
    pytest.mark.cpu_kernels,
    pytest.mark.skipif(not set(cpu_flags()) >= AVX2_FLAGS, reason="the CPU cannot run AVX2 code"),
]

KERNEL_BUILDS = [
    ("haswell", "all")
]  # started ahead of need in a broad run (tests/kernel_prebuild.py)


@pytest.fixture
def avx2_build(monkeypatch):
    """`cpu_kernels.extension()` serves the -march=haswell build for this test (built once and
    cached like any build), as a process started with TGSERVE_CPU_ISA=avx2 would."""
    monkeypatch.setenv("TGSERVE_CPU_ISA", "avx2")
    monkeypatch.setattr(cpu_kernels, "_native", [])  # the next extension() call builds or loads
    ext = cpu_kernels.extension()
    assert ext is not None, "the AVX2 build must build on an AVX2 host"
    assert cpu_kernels.selected_build().startswith("avx2 (-march=haswell")
    assert ext.__name__.startswith("tgserve_cpu_kernels_haswell_")
    return ext


@pytest.mark.parametrize("dtype", invariance.DTYPES)
@pytest.mark.parametrize("window", [None, 300])
def test_an_attention_row_does_not_depend_on_the_batch(avx2_build, dtype, window) -> None:
    invariance.test_an_attention_row_does_not_depend_on_the_batch(dtype, window)


@pytest.mark.parametrize("dtype", invariance.DTYPES)
def test_the_cpp_step_gives_a_sequence_the_same_bits_alone_or_batched(avx2_build, dtype) -> None:
    invariance.test_the_cpp_step_gives_a_sequence_the_same_bits_alone_or_batched(dtype, "qwen3")


@pytest.mark.parametrize("heads,kv_heads", [(9, 3), (6, 1)])
@pytest.mark.parametrize("window", [None, 5])
def test_attention_equals_its_float64_reference(avx2_build, heads, kv_heads, window) -> None:
    attention.test_float32_equals_reference(heads, kv_heads, 4, window)
    attention.test_bfloat16_equals_reference(heads, kv_heads, 16)


def test_the_split_keys_path_and_odd_head_dims_equal_the_reference(avx2_build) -> None:
    attention.test_split_keys_path_equals_reference(300)
    attention.test_head_dim_without_compiled_specialisation()
    for head_dim in (128, 40, 17):
        attention.test_half_precisions_and_head_dims_equal_reference(torch.float16, 2e-3, head_dim)


def test_the_cpp_step_equals_transformers(avx2_build) -> None:
    fused.test_fused_steps_equal_transformers("llama3")


@pytest.mark.parametrize("half_k", [False, True], ids=["int8", "int8v"])
def test_int8_kv_rows_equal_their_reference_and_keep_a_row_off_the_batch(
    avx2_build, half_k
) -> None:
    # int8v: K float16 rows beside int8 V rows (the same kernel with the other K row type)
    int8_attention.test_int8_rows_equal_the_reference_over_their_dequantised_values(
        9, 3, 16, 5, half_k
    )
    int8_attention.test_an_int8_row_does_not_depend_on_the_batch(half_k)
    int8_attention.test_a_prefill_chunks_int8_rows_equal_each_row_alone(9, 3, half_k)
    kind = "int8v" if half_k else "int8"
    int8_model.test_the_int8_step_gives_a_sequence_the_same_bits_alone_or_batched(
        torch.float32, kind
    )
    if half_k:
        int8_attention.test_the_cpp_append_writes_float16_k_and_int8_v_rows_under_int8v()
    else:
        int8_attention.test_int8_rows_with_bf16_queries_and_other_head_dims(40)
        int8_attention.test_the_cpp_append_writes_the_documented_rows_within_half_a_step(64)


def test_float16_kv_rows_give_the_float32_bits_and_keep_a_row_off_the_batch(avx2_build) -> None:
    half_attention.test_float16_rows_give_the_float32_bits_over_the_rounded_rows(9, 3, 16, 5)
    half_attention.test_a_prefill_chunk_over_float16_rows_gives_the_float32_bits(40)
    half_attention.test_a_float16_row_does_not_depend_on_the_batch(300)
    half_model.test_the_float16_step_gives_a_sequence_the_same_bits_alone_or_batched()


def test_every_attend_range_instance_prefetches_the_coming_chunk(avx2_build) -> None:
    prefetch.test_every_attend_range_instance_prefetches_the_coming_chunk()
