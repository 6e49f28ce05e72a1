"""Requests: a request and its sequences (the token-accounting rule), the engine's per-request
state, its output deltas, and the stream a server reads them from.
"""
