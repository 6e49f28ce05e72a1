"""Scheduling: which tokens of which sequences each step computes, and the KV blocks they
live in (pure Python, no torch): scheduler, step plan, admission check, block manager, prefix cache.
"""
