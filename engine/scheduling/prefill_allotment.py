"""Prefill allotment: how one step's prefill budget is shared between prompts (pure Python).

Contract: `allot_prefill(candidates, budget)` is phase 1 of the scheduler's prefill pass. It
decides how many prompt tokens each running partial prefill and each waiting request gets this
step, and touches nothing but `budget` (no blocks are allocated, no request changes state);
the scheduler then places the running chunks and admits the waiting ones in that order.
- Order: shortest remaining prefill first within a priority (lower value first), arrival
  order breaking ties, so a short prompt never waits behind long ones.
- The anchor: the oldest candidate of the best priority. It always gets at least its floor
  (`PrefillBudget.anchor_floor`: `MIN_PREFILL_CHUNK` tokens, fewer when the decodes leave less
  of the step-time window, never fewer than `ANCHOR_MIN_CHUNK`), held back from the budget
  (tokens and time) until its turn, so long prompts progress every step and nothing starves.
  Everybody else gets only what the window leaves: a step with decodes passes the target
  only by the anchor's few tokens, and only when the decodes alone (nearly) fill it. In a step
  no stream holds to the target, the shortest prompt, when it completes within a few tokens,
  has a floor too (`PrefillBudget.first_token_floor`): a short request is never left behind.
- A lone prompt (the only candidate, nothing placed before it) is bounded by the token
  budget alone (`PrefillBudget.alone`).
- Seats: waiting requests are admitted within the free sequence slots (`max_num_seqs` minus
  the running ones'), the anchor first, then in prefill order up to the first that does not
  fit. Once a waiting request gets no tokens, no waiting request behind it does (except the
  anchor, whose floor is reserved): nobody overtakes a request that waits.
- A waiting request's chunk starts after its prefix-cache hits (`prefix_match`), a running
  one's after its computed tokens; a group (n > 1, beams) is sized as one unit (`chunk_sizes`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from engine.requests.request import Request, RequestStatus, TokenSequence
from engine.scheduling.block_manager import PrefixMatch
from engine.scheduling.prefill_budget import MIN_PREFILL_CHUNK, PrefillBudget
from engine.scheduling.step_plan import chunk_sizes

__all__ = ["MIN_PREFILL_CHUNK", "Allot", "PrefillCandidates", "allot_prefill", "prefill_key"]


@dataclass(frozen=True)
class PrefillCandidates:
    """Who may prefill this step, and what the allotment needs to know of the scheduler."""

    partials: list[Request]  # running requests with prompt tokens left, not yet placed
    waiting: list[Request]  # waiting requests, admission order
    arrival: Mapping[Request, int]  # arrival order, kept across preemptions
    free_seats: int  # sequence slots left within max_num_seqs
    prefix_match: Callable[[Request, TokenSequence], PrefixMatch]


@dataclass(frozen=True)
class Allot:
    """Tokens per live sequence one request gets this step."""

    request: Request
    sizes: list[int]
    matches: list[PrefixMatch] | None  # a waiting request's prefix-cache hits; None: running
    is_anchor: bool


def prefill_key(request: Request, arrival: Mapping[Request, int]) -> tuple[int, int, int]:
    """Shortest remaining prefill first, within a priority; arrival order breaks ties."""
    remaining = max(s.num_uncomputed_tokens for s in request.live_seqs)
    return (request.params.priority, remaining, arrival[request])


def allot_prefill(candidates: PrefillCandidates, budget: PrefillBudget) -> list[Allot]:
    """The allotments in prefill order (empty when there is no candidate); `budget` is
    charged with every chunk allotted."""
    c = candidates
    order = sorted(c.partials + c.waiting, key=lambda r: prefill_key(r, c.arrival))
    if not order:
        return []
    if len(order) == 1 and budget.rows == 0:  # a lone prompt: the whole token budget
        budget.alone()
    best = order[0].params.priority
    anchor = min((r for r in order if r.params.priority == best), key=lambda r: c.arrival[r])
    seated = _seated(c, anchor)
    reserve, reserve_start = 0, 0
    if anchor in seated or anchor.status is RequestStatus.RUNNING:
        _, starts = _starts(c, anchor)
        reserve_start = min(starts)
        need = max(s.num_tokens - st for s, st in zip(anchor.live_seqs, starts, strict=True))
        reserve = budget.anchor_floor(reserve_start, need)
        budget.hold(reserve_start, reserve)
    allots: list[Allot] = []
    waiting_open = True
    for request in order:
        if request.status is RequestStatus.WAITING and not (
            request in seated and (waiting_open or request is anchor)
        ):
            continue
        if request is anchor:
            budget.release(reserve_start, reserve)
        seqs = request.live_seqs
        matches, starts = _starts(c, request)
        remaining = [s.num_tokens - st for s, st in zip(seqs, starts, strict=True)]
        want = sum(remaining)
        floor = reserve if request is anchor else budget.first_token_floor(want)
        n = budget.fit(starts[0], want, floor)
        sizes = chunk_sizes(remaining, n) if n > 0 else None
        if sizes is None:
            waiting_open = waiting_open and matches is None
            continue
        budget.take(starts[0], sum(sizes), sizes == remaining, request.params.streamed)
        allots.append(Allot(request, sizes, matches, request is anchor))
    return allots


def _starts(c: PrefillCandidates, request: Request) -> tuple[list[PrefixMatch] | None, list[int]]:
    """Where each live sequence's chunk starts: after a waiting request's prefix-cache hits
    (returned too), after a running one's computed tokens (matches None)."""
    seqs = request.live_seqs
    if request.status is RequestStatus.WAITING:
        matches = [c.prefix_match(request, s) for s in seqs]
        return matches, [m.num_tokens for m in matches]
    return None, [s.num_computed_tokens for s in seqs]


def _seated(c: PrefillCandidates, anchor: Request) -> set[Request]:
    """Waiting requests that find seats within max_num_seqs: the anchor first, then in
    prefill order, up to the first that does not fit."""
    free = c.free_seats
    seated: set[Request] = set()
    queue = sorted(c.waiting, key=lambda r: (r is not anchor, prefill_key(r, c.arrival)))
    for request in queue:
        if request.num_seq_slots > free:
            break
        free -= request.num_seq_slots
        seated.add(request)
    return seated
