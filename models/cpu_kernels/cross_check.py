"""The C++ kernels built for another target, and their standalone checks run there.

`python -m models.cpu_kernels.cross_check [--target aarch64|host] [--march M] [--sources]`
compiles the checks in `checks/` with the kernel sources they exercise (no torch library, no
Python: the kernels need only c10's header-only Half / BFloat16) for the target and runs them:
on this host directly, on aarch64 under qemu-user (Debian's `g++-aarch64-linux-gnu` and
`qemu-user`). `attention` (checks/attention_check.cpp): the paged attention against a float64
oracle, batch invariance, prefill rows equal to their decodes. `linear`
(checks/linear_check.cpp): the GGUF block linears' row invariance, and a digest of their float32
outputs that every build must print alike (their lanes' orders and fused multiply-adds are
written in the source). `q8` (checks/q8_check.cpp): the same for the int8 / int16 activation
linears (exact integer block sums, one fma epilogue). `--sources` also compiles every source of the extension
(`_SOURCES`) for the target: a compile check of the whole library (objects only: linking the
extension would need the target's libtorch).

Contract: `build_check(target, name, march, out)` returns the binary's path (raises
`CalledProcessError` on a compile error); `run_check(target, binary, *args)` returns the
finished process (exit 0 and "N cases, 0 failures" when every check holds; the attention
check's one argument multiplies its float64 bound, so a small one shows it can fail);
`digests(stdout)` a digest check's digests by kind (`DIGEST_CHECKS`); `compile_sources(target, march,
out_dir)` returns {source: compiler stderr} for the sources that failed. `TARGETS` names the
targets, `CHECKS` the checks; `available(target)` says whether the target's tools are here.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import sysconfig
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from torch.utils.cpp_extension import include_paths

_DIR = Path(__file__).parent
# check name -> the kernel sources it links with its own (checks/<name>_check.cpp)
CHECKS = {
    "attention": ("attention.cpp",),
    "linear": ("block_linear.cpp", "kquant_linear.cpp", "mixed_blocks.cpp", "linear.cpp"),
    "q8": ("q8_linear.cpp", "q8_quantize.cpp"),
}
# checks whose digests every build of every target must print alike
DIGEST_CHECKS = ("linear", "q8")


@dataclass(frozen=True)
class Target:
    compiler: str
    default_march: str
    runner: tuple[str, ...]  # prefix of the command that runs a binary built for it
    triplet: str  # Debian's multiarch name (the Python headers' per-target pyconfig.h)


TARGETS = {
    "host": Target("g++", "native", (), ""),
    # armv8-a: the baseline every aarch64 core runs (NEON included); -march=native on the host.
    "aarch64": Target(
        "aarch64-linux-gnu-g++",
        "armv8-a",
        ("qemu-aarch64", "-L", "/usr/aarch64-linux-gnu"),
        "aarch64-linux-gnu",
    ),
}


def available(target: Target) -> bool:
    """Whether this host has the target's compiler and runner."""
    tools = [target.compiler, *target.runner[:1]]
    return all(shutil.which(tool) for tool in tools)


def _flags(march: str) -> list[str]:
    return [
        "-std=c++17",
        "-O3",
        f"-march={march}",
        "-fopenmp",
        *(f"-I{p}" for p in include_paths()),
    ]


def build_check(target: Target, name: str, march: str, out: Path) -> Path:
    """The check `name` (CHECKS) for `target` at -march=`march`, into `out`."""
    sources = [str(_DIR / src) for src in CHECKS[name]] + [
        str(_DIR / "checks" / f"{name}_check.cpp")
    ]
    cmd = [target.compiler, *_flags(march), *sources, "-o", str(out)]
    subprocess.run(cmd, check=True, capture_output=True, text=True)
    return out


def run_check(
    target: Target, binary: Path, *args: str, threads: int = 2, timeout: float = 600
) -> subprocess.CompletedProcess:
    """Run a check (under the target's runner) on `threads` OpenMP threads."""
    cmd = [*target.runner, str(binary), *args]
    env = {**os.environ, "OMP_NUM_THREADS": str(threads)}
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def digests(stdout: str) -> dict[str, str]:
    """A digest check's "digest <kind> <hex>" lines, by kind."""
    return dict(line.split()[1:3] for line in stdout.splitlines() if line.startswith("digest "))


def _python_includes(target: Target, scratch: Path) -> list[str]:
    """Python's headers for `target`. Debian's pyconfig.h includes the per-target one
    (<triplet>/python3.X/pyconfig.h), which only the target's -dev package installs; for a
    compile check another LP64 Linux target's stands in (same type sizes)."""
    include = Path(sysconfig.get_paths()["include"])
    flags = [f"-I{include}"]
    if target.triplet:
        host_config = next(
            include.parent.parent.glob(f"include/*-linux-gnu/{include.name}/pyconfig.h"), None
        )
        if host_config is not None:
            shim = scratch / target.triplet / include.name
            shim.mkdir(parents=True, exist_ok=True)
            shutil.copy(host_config, shim / "pyconfig.h")
            flags.insert(0, f"-I{scratch}")
    return flags


def compile_sources(target: Target, march: str, out_dir: Path, jobs: int = 2) -> dict[str, str]:
    """Every source of the extension compiled for `target` into `out_dir`; the failures'
    compiler messages by source (empty: all compiled)."""
    from models.cpu_kernels import _SOURCES

    python = _python_includes(target, out_dir)

    def one(name: str) -> tuple[str, subprocess.CompletedProcess]:
        cmd = [
            target.compiler,
            *_flags(march),
            *python,
            "-c",
            str(_DIR / name),
            "-o",
            str(out_dir / f"{name}.o"),
        ]
        return name, subprocess.run(cmd, capture_output=True, text=True)

    with ThreadPoolExecutor(jobs) as pool:
        results = list(pool.map(one, _SOURCES))
    return {name: proc.stderr for name, proc in results if proc.returncode != 0}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m models.cpu_kernels.cross_check")
    parser.add_argument("--target", choices=sorted(TARGETS), default="aarch64")
    parser.add_argument("--march", default=None, help="default: the target's baseline")
    parser.add_argument("--sources", action="store_true", help="also compile every source")
    args = parser.parse_args(argv)
    target = TARGETS[args.target]
    march = args.march or target.default_march
    if not available(target):
        print(f"{args.target}: needs {target.compiler} and {target.runner[:1] or '-'} on PATH")
        return 2
    with tempfile.TemporaryDirectory() as tmp:
        if args.sources:
            failed = compile_sources(target, march, Path(tmp))
            for name, err in failed.items():
                print(f"{name}: does not compile for {args.target} -march={march}\n{err}")
            if failed:
                return 1
            print(f"every source compiles for {args.target} -march={march}")
        code = 0
        for name in CHECKS:
            proc = run_check(target, build_check(target, name, march, Path(tmp) / name))
            print(f"{name} check ({args.target} -march={march}):\n{proc.stdout}", end="")
            code = code or proc.returncode
        return code


if __name__ == "__main__":
    sys.exit(main())
