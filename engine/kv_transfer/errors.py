"""The errors of a K/V transfer between a prefill and a decode server (torch-free: the server
floor maps them to its answers).

`KVPeerError`: the peer is unreachable, gone or holds other K/V; its message names the
address. `KVSenderFull`: the K/V already waiting to be sent fills its bound (retry later).
"""

from __future__ import annotations


class KVPeerError(RuntimeError):
    """The K/V transfer peer is unreachable, gone or incompatible; the message names it."""


class KVSenderFull(RuntimeError):
    """The K/V waiting to be sent already fills the bound."""
