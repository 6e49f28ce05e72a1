"""N-gram prompt lookup: proposes the tokens that followed the last time the current suffix
occurred in the sequence (prompt + output so far). No model, no state between calls.

Contract: `NgramProposer(num_tokens, min_n, max_n).propose(token_ids, limit)` returns at most
`min(num_tokens, limit)` token ids (possibly none). It looks for the longest n in
[min_n, max_n] such that the last n tokens also occur earlier in `token_ids` (ending before the
last token), takes the most recent such occurrence, and proposes the tokens that followed it
(fewer than `num_tokens` when the occurrence ends close to the end of the sequence). No n-gram
of length >= min_n recurs: no proposal.

Cost per call: one O(L) scan for earlier positions of the last token, then O(candidates * n)
to extend them backwards (numpy, no Python loop over the sequence); L = len(token_ids).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class NgramProposer:
    def __init__(self, num_tokens: int, min_n: int = 1, max_n: int = 4) -> None:
        if num_tokens < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1, got {num_tokens}")
        if not 1 <= min_n <= max_n:
            raise ValueError(
                f"speculative n-gram lengths need 1 <= min <= max, got min {min_n}, max {max_n}"
            )
        self.num_tokens = num_tokens
        self.min_n = min_n
        self.max_n = max_n

    def propose(self, token_ids: Sequence[int], limit: int | None = None) -> tuple[int, ...]:
        """Up to `min(num_tokens, limit)` tokens continuing `token_ids` (see the contract)."""
        k = self.num_tokens if limit is None else min(self.num_tokens, limit)
        length = len(token_ids)
        max_n = min(self.max_n, length - 1)  # an earlier occurrence must end before the last
        if k <= 0 or max_n < self.min_n:
            return ()
        ids = np.asarray(token_ids, dtype=np.int64)
        # ends[j]: an occurrence of the last token at ends[j] - 1, ending before the sequence's end
        ends = np.flatnonzero(ids[:-1] == ids[-1]) + 1
        matched = np.ones(ends.shape, dtype=np.int64)  # suffix length each candidate matches
        for back in range(1, max_n):  # compare one more token before each live candidate
            live = (matched == back) & (ends - 1 - back >= 0)
            if not live.any():
                break
            before = ids[np.maximum(ends - 1 - back, 0)]
            matched[live & (before == ids[length - 1 - back])] += 1
        if not ends.size:
            return ()
        best = int(matched.max())
        if best < self.min_n:
            return ()
        end = int(ends[np.flatnonzero(matched == best)[-1]])  # the most recent of the longest
        return tuple(int(t) for t in ids[end : end + k])
