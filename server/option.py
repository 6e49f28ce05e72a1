"""Option: one `tgserve serve` option, a CLI flag and a TGSERVE_* variable (server/options.py
holds the table of them).

Contract: an `Option` is its destination (the Settings field), the parser of its text, its
help; a `repeatable` flag may be given several times (its variable a comma list); a
`flag_is_switch` flag takes no value; `choices` are the only values it may take; `default` says
in words what unset means where the setting's value is None (`ENGINE_DEFAULT`: EngineConfig's
field of the same name says it). `flag` and `env` are its two spellings.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

ENGINE_DEFAULT = "<engine>"  # Option.default: EngineConfig's field of the same name says it


@dataclass(frozen=True)
class Option:
    dest: str
    parse: Callable[[str], Any]
    help: str
    repeatable: bool = False  # the flag may be given several times; the variable is a comma list
    flag_is_switch: bool = False
    choices: tuple[str, ...] = ()  # the values accepted (empty: any the parser takes)
    default: str | None = None  # what unset means, where the setting's default is None

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")

    @property
    def env(self) -> str:
        return "TGSERVE_" + self.dest.upper()
