"""Requests (the floor above engine/types.py): what a request is and asks for — its sequences
(the token-accounting rule), its `SamplingParams` (with a structured output and, for tests, a
fault), its output deltas, and the stream a server reads them from. Imports only the floor
below; the engine's per-request state (engine/request_state.py) lives on the top floor.
"""
