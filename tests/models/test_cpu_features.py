"""The one /proc/cpuinfo parser (models/cpu_features.py): the flags it reads, and the native
bfloat16 the engine's "auto" dtype asks it about."""

from __future__ import annotations

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


def test_a_cpu_device_asks_the_cpu_flags():
    assert native_bf16(torch.device("cpu")) == cpu_has_native_bf16()


def test_the_model_name_is_that_of_the_first_cpu():
    info = "processor : 0\nmodel name\t: Intel(R) Xeon(R) Gold 6430\nflags : fpu\n\n"
    info += "processor : 1\nmodel name\t: another\n"
    assert cpu_model_name(info) == "Intel(R) Xeon(R) Gold 6430"
    assert cpu_model_name("flags : fpu\n") == ""
