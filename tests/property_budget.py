"""How many examples the property tests draw: their own count, or fewer under the CI profile.

`.ci/run` sets TGSERVE_HYPOTHESIS_PROFILE=ci (tests/conftest.py loads that hypothesis profile:
no deadlines, CI machines are shared). The slowest property tests (those that build an engine
or run a tokenizer per example) then draw `ci` examples instead of `local`: the same
properties, the same strategies, fewer draws, so the suite fits CI's time on 2 cores. Locally
(no variable) every test draws its full count.
"""

from __future__ import annotations

import os

PROFILE = os.environ.get("TGSERVE_HYPOTHESIS_PROFILE", "default")


def examples(local: int, ci: int) -> int:
    return ci if PROFILE == "ci" else local
