"""The C++ attention kernel beyond the build this host serves: its standalone check
(models/cpu_kernels/checks/attention_check.cpp: a float64 oracle, batch invariance, a prefill
chunk's rows equal to their decodes) built and run for this host's x86 builds, and for aarch64
under qemu-user where Debian's cross compiler and qemu are installed (`apt-get install
g++-aarch64-linux-gnu qemu-user`); and the rule that lets every source compile off x86."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from models.cpu_features import AVX2_FLAGS, cpu_flags
from models.cpu_kernels import cross_check

KERNELS = Path(cross_check.__file__).parent
HOST = cross_check.TARGETS["host"]
AARCH64 = cross_check.TARGETS["aarch64"]
# This host's builds: its own, and the older x86 ones it can run (the portable loops are the
# ones aarch64 compiles).
HOST_MARCHES = ["native", "x86-64-v2"] + (["haswell"] if set(cpu_flags()) >= AVX2_FLAGS else [])


@pytest.fixture(scope="module")
def host_checks(tmp_path_factory) -> dict[str, Path]:
    out = tmp_path_factory.mktemp("attention_check")
    return {m: cross_check.build_attention_check(HOST, m, out / m) for m in HOST_MARCHES}


@pytest.mark.parametrize("march", HOST_MARCHES)
def test_attention_check_passes_on_this_hosts_builds(host_checks, march):
    proc = cross_check.run_attention_check(HOST, host_checks[march])
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert re.search(r"^12 cases, 0 failures$", proc.stdout, re.M)


def test_the_checks_float64_bound_can_fail(host_checks):
    # The same build against a bound 1000x tighter than float32's rounding allows: the float64
    # comparison must report rows (the bitwise checks do not depend on the bound).
    proc = cross_check.run_attention_check(HOST, host_checks["native"], bound_scale=1e-3)
    assert proc.returncode == 1
    assert "off float64" in proc.stdout


def test_x86_intrinsics_headers_are_included_only_on_x86():
    # Unguarded, <immintrin.h> stopped four sources (and the whole library) compiling for
    # aarch64: each include sits right inside an x86 guard.
    include = re.compile(r"\s*#\s*include\s*<(immintrin|x86intrin|[exptsn]mmintrin)\.h>")
    unguarded = []
    for path in sorted(KERNELS.rglob("*")):
        if path.suffix not in (".h", ".cpp"):
            continue
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if include.match(line) and (i == 0 or "__x86_64__" not in lines[i - 1]):
                unguarded.append(f"{path.relative_to(KERNELS)}:{i + 1}")
    assert unguarded == []


needs_aarch64 = pytest.mark.skipif(
    not cross_check.available(AARCH64),
    reason="no aarch64 cross compiler and qemu-aarch64 here (apt-get install g++-aarch64-linux-gnu qemu-user)",
)


@needs_aarch64
def test_attention_check_passes_on_aarch64_under_qemu(tmp_path):
    binary = cross_check.build_attention_check(AARCH64, AARCH64.default_march, tmp_path / "check")
    proc = cross_check.run_attention_check(AARCH64, binary)
    assert proc.returncode == 0, proc.stdout[-3000:]
    assert re.search(r"^12 cases, 0 failures$", proc.stdout, re.M)


@needs_aarch64
def test_every_kernel_source_compiles_for_aarch64(tmp_path):
    assert cross_check.compile_sources(AARCH64, AARCH64.default_march, tmp_path) == {}
