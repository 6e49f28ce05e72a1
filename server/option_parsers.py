"""The parsers of option text (server/options.py's table): each turns a flag's or a TGSERVE_*
variable's text into a value, or raises ValueError with a message a user can act on.

`parse_size` reads "1073741824", "512MiB" (powers of 1024) or "2GB" / "2G" (powers of 1000);
`_bool` true/false words; `_positive_float` / `_non_negative_float` seconds; `_milliseconds` 0
(off) or [1, 60000]; `words` a comma list; `_origins` CORS origins (`*` or scheme://host[:port]);
`_name_path` NAME=PATH (a LoRA adapter).
"""

from __future__ import annotations

import math
import re

_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([kmgt]?)(i?)b?\s*$", re.IGNORECASE)


def parse_size(text: str) -> int:
    """Bytes from "1073741824", "512MiB" (powers of 1024) or "2GB" / "2G" (powers of 1000)."""
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"expected a size such as 2GiB, 512MiB or 1000000000, got {text!r}")
    number, unit, binary = match.groups()
    base = 1024 if binary else 1000
    return int(float(number) * base ** " kmgt".index(unit.lower() or " "))


def _bool(text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in ("1", "true", "yes", "on"):
        return True
    if lowered in ("0", "false", "no", "off", ""):
        return False
    raise ValueError(f"expected true or false, got {text!r}")


def _name_path(text: str) -> tuple[str, str]:
    name, _, path = text.partition("=")
    if not name or not path:
        raise ValueError(f"expected NAME=PATH (e.g. sql=/adapters/sql), got {text!r}")
    return name, path


def _positive_float(text: str) -> float:
    value = float(text)
    if not (value > 0 and math.isfinite(value)):
        raise ValueError(f"expected a positive number of seconds, got {text!r}")
    return value


def _non_negative_float(text: str) -> float:
    value = float(text)
    if not (value >= 0 and math.isfinite(value)):
        raise ValueError(f"expected a number of seconds >= 0, got {text!r}")
    return value


def _milliseconds(text: str) -> float:
    value = float(text)
    if not (value == 0 or 1 <= value <= 60_000):
        raise ValueError(f"expected 0 (off) or milliseconds in [1, 60000], got {text!r}")
    return value


def words(text: str) -> tuple[str, ...]:
    return tuple(w.strip() for w in text.split(",") if w.strip())


def _origins(text: str) -> tuple[str, ...]:
    """Origins from one flag value: `*` or scheme://host[:port], a trailing slash dropped."""
    origins = tuple(o.rstrip("/") for o in words(text))
    for origin in origins:
        if origin != "*" and not re.match(r"^https?://[^/\s]+$", origin):
            raise ValueError(f"expected * or an origin such as https://app.example, got {origin!r}")
    return origins
