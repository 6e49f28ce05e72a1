"""Speculative decoding: proposers guess the next k tokens of a sequence, the target model
scores them in one forward, and a verification rule keeps the prefix it agrees with.

Rooms: `config.py` (the flags), `ngram.py` (prompt lookup), `draft.py` (a draft model's greedy
continuation), `speculator.py` (who speculates, how far; grammar cuts), `acceptance.py`
(verification rules), `verification.py` (a verdict committed in the per-token update),
`counters.py` (proposed / accepted per position). docs/speculative-decoding.md has the design.
"""
