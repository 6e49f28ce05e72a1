"""The one /proc/cpuinfo parser (models/cpu_features.py): the flags it reads, and the native
bfloat16 the engine's "auto" dtype asks it about."""

from __future__ import annotations

import pytest
import torch

from models.cpu_features import cpu_flags, cpu_has_native_bf16, cpu_model_name, native_bf16


def test_native_bf16_is_read_from_the_cpu_flags():
    assert cpu_has_native_bf16("processor : 0\nflags : fpu avx512f avx512_bf16 avx512vl\n")
    assert cpu_has_native_bf16("flags\t\t: fpu amx_bf16 amx_tile\n")
    assert not cpu_has_native_bf16("flags : fpu avx2 avx512f avx512_fp16\n")
    assert not cpu_has_native_bf16("model name : something without flags\n")


def test_the_flags_are_those_of_the_first_cpu_in_their_order():
    info = "processor : 0\nflags\t\t: fpu avx2 sse\n\nprocessor : 1\nflags : fpu\n"
    assert cpu_flags(info) == ("fpu", "avx2", "sse")
    assert cpu_flags("model name : no flags line\n") == ()


def test_an_arm_cpus_features_stand_for_its_flags():
    # aarch64's /proc/cpuinfo (a Neoverse V1's first lines): `Features`, no `flags` line
    info = "processor\t: 0\nBogoMIPS\t: 2100.00\nFeatures\t: fp asimd evtstrm aes sve\nCPU implementer\t: 0x41\n"
    assert cpu_flags(info) == ("fp", "asimd", "evtstrm", "aes", "sve")
    assert not cpu_has_native_bf16(info)


def test_a_cpu_device_asks_the_cpu_flags():
    assert native_bf16(torch.device("cpu")) == cpu_has_native_bf16()


def test_the_model_name_is_that_of_the_first_cpu():
    info = "processor : 0\nmodel name\t: Intel(R) Xeon(R) Gold 6430\nflags : fpu\n\n"
    info += "processor : 1\nmodel name\t: another\n"
    assert cpu_model_name(info) == "Intel(R) Xeon(R) Gold 6430"
    assert cpu_model_name("flags : fpu\n") == ""


def test_the_forced_kernel_build_is_read_from_the_setting_and_checked_against_the_flags():
    from models.cpu_features import AVX2_FLAGS, AVX512_FLAGS, kernel_march

    assert kernel_march(None) == kernel_march("") == kernel_march("native") == "native"
    assert kernel_march("avx2", tuple(AVX512_FLAGS)) == "haswell"  # older build, newer host
    assert kernel_march("avx512", tuple(AVX512_FLAGS)) == "icelake-server"
    assert kernel_march("portable", ("sse2",)) == "x86-64-v2"
    with pytest.raises(ValueError, match="TGSERVE_CPU_ISA='avx3'.*native, avx512, avx2"):
        kernel_march("avx3", tuple(AVX512_FLAGS))
    with pytest.raises(ValueError, match=r"TGSERVE_CPU_ISA=avx512 needs .*'avx512f'"):
        kernel_march("avx512", tuple(AVX2_FLAGS))


def test_the_kernels_read_the_setting_when_built_not_at_import(monkeypatch):
    from models import cpu_kernels

    monkeypatch.setenv("TGSERVE_CPU_ISA", "portable")
    assert cpu_kernels.selected_build() == "portable (-march=x86-64-v2, TGSERVE_CPU_ISA)"
    monkeypatch.delenv("TGSERVE_CPU_ISA")
    assert cpu_kernels.selected_build() == "native"
