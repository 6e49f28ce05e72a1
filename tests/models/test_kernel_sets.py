"""The kernel sets a build can compile (models/cpu_kernels KERNEL_SETS): what the "linear" set's
build shares with the whole library's, and what keys its cache. No compiler runs here; the
builds themselves are held to the native bits by tests/models/test_kernel_isa_builds.py and
tests/models/test_q8_isa_builds.py.
"""

from __future__ import annotations

import shutil

from models import cpu_kernels

MACRO = "TGSERVE_LINEAR_KERNELS_ONLY"


def test_a_set_compiles_the_whole_librarys_sources_with_its_flags_under_its_own_name(
    tmp_path, monkeypatch
) -> None:
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path))  # specs make their folders
    whole, linear = (
        cpu_kernels.build_spec("x86-64-v2"),
        cpu_kernels.build_spec("x86-64-v2", "linear"),
    )
    assert linear.name != whole.name and linear.build_dir != whole.build_dir
    assert linear.name.startswith("tgserve_cpu_kernels_linear_x86_64_v2_")
    assert whole.name.startswith("tgserve_cpu_kernels_x86_64_v2_")  # as before sets existed
    names = {source.rsplit("/", 1)[1] for source in linear.sources}
    assert names < {source.rsplit("/", 1)[1] for source in whole.sources}
    assert {"linear.cpp", "block_linear.cpp", "kquant_linear.cpp", "q8_linear.cpp"} <= names
    assert linear.cflags == (*whole.cflags, f"-D{MACRO}")
    assert linear.ldflags == whole.ldflags and linear.include_dirs != whole.include_dirs


def test_only_the_bindings_read_the_sets_macro() -> None:
    """The macro reaches every unit of the set's build: only bindings.cpp may read it, so the
    kernels' own units compile exactly as in the whole library."""
    folder = cpu_kernels._DIR
    readers = [
        path.name
        for path in sorted(folder.iterdir())
        if path.suffix in (".cpp", ".h") and MACRO in path.read_text()
    ]
    assert readers == ["bindings.cpp"]
    bindings = (folder / "bindings.cpp").read_text()
    # Each guard only skips code (#ifndef ... #endif): the set compiles no code another way.
    guards = [line.split()[0] for line in bindings.splitlines() if MACRO in line]
    assert guards and set(guards) == {"#ifndef", "#endif"}, guards


def test_a_change_to_any_source_or_header_renames_every_sets_build(tmp_path, monkeypatch) -> None:
    copy = tmp_path / "cpu_kernels"
    shutil.copytree(cpu_kernels._DIR, copy, ignore=shutil.ignore_patterns("__pycache__"))
    monkeypatch.setattr(cpu_kernels, "_DIR", copy)
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "builds"))  # specs make folders
    names = {
        kernels: cpu_kernels.build_spec("haswell", kernels).name for kernels in ("all", "linear")
    }
    for changed in ("block_linear.cpp", "q8_dot.h", "decoder.cpp"):
        with open(copy / changed, "a") as f:
            f.write("\n// changed\n")
        for kernels, before in names.items():
            after = cpu_kernels.build_spec("haswell", kernels).name
            assert after != before, (changed, kernels)
            names[kernels] = after
