"""The C++ paged attention asks for each coming chunk's K/V rows ahead of use (attention_layout.h:
blocks sit anywhere in memory, so the hardware prefetcher cannot guess them). That is a property
of the compiled code, not of the source: GCC 12 at -O3 once compiled a lambda's
`__builtin_prefetch` out of every `attend_range` instance but int8's, and batch-64 decode ran
1.16-1.25x slower with the same bits, so no behaviour test could see it. This reads the loaded
build's machine code and checks every instance of `attend_range` (each cache type, each head_dim
specialisation) still holds its prefetches.
"""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from models import cpu_kernels

pytestmark = pytest.mark.cpu_kernels

# A function's first line in `objdump -d -C`: "0000000000040960 <void tgserve::attn::...>:"
_FUNCTION = re.compile(r"^[0-9a-f]+ <(.*)>:$")


def _attend_range_bodies(library: str) -> dict[str, str]:
    """Demangled name -> disassembly of each attend_range instance in the shared library."""
    listing = subprocess.run(
        ["objdump", "-d", "--no-show-raw-insn", "-C", library],
        check=True,
        capture_output=True,
        text=True,
    ).stdout
    bodies: dict[str, list[str]] = {}
    current: list[str] | None = None
    for line in listing.splitlines():
        if match := _FUNCTION.match(line):
            name = match.group(1)
            wanted = "tgserve::attn::attend_range<" in name and not name.endswith("@plt")
            current = bodies.setdefault(name, []) if wanted else None
        elif current is not None:
            current.append(line)
    return {name: "\n".join(lines) for name, lines in bodies.items()}


def test_every_attend_range_instance_prefetches_the_coming_chunk() -> None:
    if shutil.which("objdump") is None:
        pytest.skip("objdump (binutils) is not installed: the machine code cannot be read")
    ext = cpu_kernels.extension()
    assert ext is not None, "the C++ kernels must build on this host"
    bodies = _attend_range_bodies(ext.__file__)
    # float32, bf16, float16, int8, float16 K with int8 V rows; head_dim 64, 128 and any
    assert len(bodies) >= 12, sorted(bodies)
    missing = [name for name, body in bodies.items() if "prefetch" not in body]
    assert not missing, f"attend_range compiled without its prefetches: {missing}"
