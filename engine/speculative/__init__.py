"""Speculative decoding: proposers guess the next k tokens of a sequence, the target model
scores them in one forward, and a verification rule keeps the prefix it agrees with.

Rooms: `config.py` (the flags), `ngram.py` (prompt lookup), `acceptance.py` (greedy and
rejection-sampling verification), `counters.py` (proposed / accepted per position).
docs/speculative-decoding.md has the design, the draft-model proposer's included.
"""
