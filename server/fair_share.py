"""Fair admission: one client cannot take the whole in-flight capacity from the others.

Contract:
- `CLIENT` (a ContextVar) is the identity of the client whose request runs in this task, set by
  the guard (server/guard.py): "key:N" for the N-th `--api-key`, None on a server without keys
  (nothing tells its clients apart, so the rules below that need an identity do not apply).
  `TRUSTED` says whether that client may raise its `priority` (`--priority-keys`).
- `FairShare(limit)`: the last `reserve` in-flight places (an eighth of `limit`, at least one)
  go only to clients with nothing in flight: `check(client, pending, count)` raises the 429 (with
  Retry-After) for a client that already holds requests when admitting `count` more would dip
  into them. However many requests one key keeps sending, a client with none in flight finds a
  place unless `reserve` other such clients took them. `hold(client, count)` counts what a client
  holds and returns the function that gives it back (once, when its stream ends).
- `prompt_share(limit)`: the most prompts one request may carry, a quarter of `limit` (at least
  one), so one request never takes the whole capacity (`--max-prompts-per-request` overrides).
- `capped_priority(priority)`: a `priority` below 0 (ahead of the default) only for a trusted
  client; anyone else's is raised to 0. Higher values (behind the default) are anyone's.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from contextvars import ContextVar

from server.errors import ApiError

CLIENT: ContextVar[str | None] = ContextVar("tgserve_client", default=None)
TRUSTED: ContextVar[bool] = ContextVar("tgserve_trusted", default=False)


def prompt_share(limit: int) -> int:
    return max(1, limit // 4)


def capped_priority(priority: int) -> int:
    return priority if priority >= 0 or TRUSTED.get() else 0


class FairShare:
    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.reserve = max(1, limit // 8)
        self._held: Counter[str] = Counter()

    def check(self, client: str | None, pending: int, count: int) -> None:
        """On the event loop, with no await between it and the admission it guards."""
        if client is None or not self._held[client]:
            return
        if pending + count > self.limit - self.reserve:
            raise ApiError(
                429,
                f"this client already has {self._held[client]} requests in flight and the "
                f"server keeps its last {self.reserve} places for other clients; retry later",
                code="overloaded",
                headers={"Retry-After": "1"},
            )

    def hold(self, client: str | None, count: int) -> Callable[[], None]:
        if client is None:
            return lambda: None
        self._held[client] += count
        released = False

        def release() -> None:
            nonlocal released
            if not released:
                released = True
                self._held[client] -= count
                if self._held[client] <= 0:
                    del self._held[client]

        return release

    def held(self, client: str) -> int:
        return self._held[client]
