"""Keys of the K/V tiers: a strong chained block hash, and the namespace that scopes it.

Contract:
- `chained_block_hash(parent, tokens)` is the block manager's hash function when tiers are on:
  a 128-bit BLAKE2b digest of the parent block's hash and the block's token ids (as an int),
  the same in every process. So the pool's prefix cache and every tier key a block by one
  value, a block's key covers its whole prefix (the chain), and a key found in a file written
  by an earlier process names the same tokens. The pool still confirms its hits by tokens and
  parent; the tiers confirm theirs by tokens and the key (a 128-bit collision is not a risk
  we guard against).
- `TierNamespace` is everything besides the tokens that decides a block's K/V bytes: model
  identity, tokenizer, dtype, KV-cache dtype, the forward path (the PyTorch and C++ paths
  agree to rounding only) and the tgserve version. A request's LoRA adapter is in the key
  itself: its chain starts from a hash of the adapter's name and weights' digest
  (engine/scheduling/prefix_cache.py's `root_hash`), so one store serves every adapter and
  the base, and a hit never crosses them. Its `digest` is written in every file and folded into
  file names, so K/V of another model, version or path is never served.
"""

from __future__ import annotations

import hashlib
from array import array
from dataclasses import dataclass
from importlib import metadata

_KEY_BYTES = 16


def chained_block_hash(parent_hash: int | None, tokens: tuple[int, ...]) -> int:
    h = hashlib.blake2b(digest_size=_KEY_BYTES)
    h.update((parent_hash or 0).to_bytes(_KEY_BYTES, "little"))
    h.update(b"\x01" if parent_hash is not None else b"\x00")  # block 0 vs a zero parent
    h.update(array("q", tokens).tobytes())
    return int.from_bytes(h.digest(), "little")


def tgserve_version() -> str:
    try:
        return metadata.version("tgserve")
    except metadata.PackageNotFoundError:  # a checkout that was never installed
        return "0+unknown"


@dataclass(frozen=True)
class TierNamespace:
    model: str  # the model's identity: its path and its config's digest
    tokenizer: str  # the tokenizer's identity (its name and vocabulary size)
    dtype: str  # the model's compute dtype
    kv_dtype: str  # the KV cache's element dtype
    forward_path: str  # how steps run (PyTorch ops vs the C++ kernels, ...)
    version: str = ""  # the tgserve version that wrote the K/V

    @property
    def digest(self) -> bytes:
        fields = (
            self.model,
            self.tokenizer,
            self.dtype,
            self.kv_dtype,
            self.forward_path,
            self.version,
        )
        return hashlib.blake2b("\x1f".join(fields).encode(), digest_size=_KEY_BYTES).digest()

    def file_stem(self, key: int) -> str:
        """The file name (without suffix) of `key` under this namespace."""
        h = hashlib.blake2b(self.digest, digest_size=20)
        h.update(key.to_bytes(_KEY_BYTES, "little"))
        return h.hexdigest()
