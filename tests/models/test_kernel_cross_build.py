"""The C++ kernels beyond the build this host serves: their standalone checks
(models/cpu_kernels/checks/: the paged attention against a float64 oracle, batch invariance and
a prefill chunk's rows equal to their decodes; the GGUF block linears' row invariance and a
digest of their float32 outputs; the same for the int8 / int16 activation linears) built and run for this host's x86 builds, and for aarch64
under qemu-user where Debian's cross compiler and qemu are installed (`apt-get install
g++-aarch64-linux-gnu qemu-user`); and the rule that lets every source compile off x86."""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
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


def passed(proc, cases: int) -> bool:
    return proc.returncode == 0 and re.search(rf"^{cases} cases, 0 failures$", proc.stdout, re.M)


@pytest.fixture(scope="module")
def host_checks(tmp_path_factory) -> dict[tuple[str, str], Path]:
    out = tmp_path_factory.mktemp("kernel_checks")
    builds = [(name, march) for name in cross_check.CHECKS for march in HOST_MARCHES]
    with ThreadPoolExecutor(2) as pool:  # each build is one compiler process
        paths = pool.map(
            lambda b: cross_check.build_check(HOST, *b, out / f"{b[0]}-{b[1]}"), builds
        )
        return dict(zip(builds, paths, strict=True))


@pytest.mark.parametrize("march", HOST_MARCHES)
def test_the_attention_check_passes_on_this_hosts_builds(host_checks, march):
    proc = cross_check.run_check(HOST, host_checks["attention", march])
    assert passed(proc, 12), proc.stdout[-3000:]


def test_the_attention_checks_float64_bound_can_fail(host_checks):
    # The same build against a bound 1000x tighter than float32's rounding allows: the float64
    # comparison must report rows (the bitwise checks do not depend on the bound).
    proc = cross_check.run_check(HOST, host_checks["attention", "native"], "1e-3")
    assert proc.returncode == 1
    assert "off float64" in proc.stdout


@pytest.mark.parametrize("check", cross_check.DIGEST_CHECKS)
def test_the_linears_give_every_x86_build_the_same_bits(host_checks, check):
    # linear: the GGUF block linears, float32 activations; q8: int8 / int16 activations
    runs = {m: cross_check.run_check(HOST, host_checks[check, m]) for m in HOST_MARCHES}
    for march, proc in runs.items():
        assert passed(proc, 24), (march, proc.stdout[-3000:])
    found = {m: cross_check.digests(proc.stdout) for m, proc in runs.items()}
    assert len(found["native"]) == 8
    assert all(d == found["native"] for d in found.values()), found


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


def test_every_kernel_file_is_staged_into_the_build():
    # A build compiles staged copies of _SOURCES and _HEADERS (and its name hashes them): a
    # header left out fails the compile on a fresh machine, or, once staged by hand, an edit to
    # it would not change the build's name and an old library would load.
    from models import cpu_kernels

    on_disk = {p.name for p in KERNELS.glob("*") if p.suffix in (".h", ".cpp")}
    staged = set(cpu_kernels._SOURCES) | set(cpu_kernels._HEADERS)
    assert on_disk - staged == set()
    assert staged - on_disk == set()


needs_aarch64 = pytest.mark.skipif(
    not cross_check.available(AARCH64),
    reason="no aarch64 cross compiler and qemu-aarch64 here "
    "(apt-get install g++-aarch64-linux-gnu qemu-user)",
)


@needs_aarch64
def test_the_attention_check_passes_on_aarch64_under_qemu(tmp_path):
    binary = cross_check.build_check(AARCH64, "attention", AARCH64.default_march, tmp_path / "a")
    proc = cross_check.run_check(AARCH64, binary)
    assert passed(proc, 12), proc.stdout[-3000:]


@needs_aarch64
@pytest.mark.parametrize("check", cross_check.DIGEST_CHECKS)
def test_the_linears_give_aarch64_the_x86_bits(host_checks, tmp_path, check):
    binary = cross_check.build_check(AARCH64, check, AARCH64.default_march, tmp_path / check)
    proc = cross_check.run_check(AARCH64, binary)
    assert passed(proc, 24), proc.stdout[-3000:]
    native = cross_check.run_check(HOST, host_checks[check, "native"])
    assert cross_check.digests(proc.stdout) == cross_check.digests(native.stdout)


@needs_aarch64
def test_every_kernel_source_compiles_for_aarch64(tmp_path):
    assert cross_check.compile_sources(AARCH64, AARCH64.default_march, tmp_path) == {}
