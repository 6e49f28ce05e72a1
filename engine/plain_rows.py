"""The steady state's update: a step whose every chunk is a plain row (`StepPlan.plain`: one
sequence, one draw, no prompt logprobs, forks, proposals or beams) applied in one pass (issue 38):
chunk i of `plan.chunks` is row i and draw i.

Contract: `land_plain_rows(update, plan, out, scheduled_at, held)` does for such a step what
`StepUpdate.apply` does (step_update.py) and returns the same `RequestState`s in the same
order: per row, in chunk order, a request that ended before the update (the overlapped loop's
held step) is skipped; else its token lands (`update._land`: appended, or put in its
placeholder when `held`, counted, the stop criteria checked), its news noted (`update._note`:
a preemption, a first schedule; none in a steady plan's rows, `StepPlan.steady`), and the request moved. A row whose landing raises fails alone. Why a pass of its own:
the general update visits each row in three loops (the sampled rows, the rows' chunks, and a
set of the ended requests first); here each row is one iteration, and a step held as columns
(engine/scheduling/decode_columns.py) is read by index, no chunk built. The caller checks
`out.failed` is empty (a failed row takes the general path).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from engine.request_state import RequestState
from engine.requests.request import RequestStatus, TokenSequence
from engine.sampling.step_io import StepOutput
from engine.sampling_plan import StepPlan
from engine.scheduling.decode_columns import DecodeColumns
from engine.scheduling.step_plan import ScheduledChunk
from engine.types import TokenLogprob


class RowUpdate(Protocol):
    """What the pass uses of the step update (step_update.py's StepUpdate): its live requests
    and its per-row steps (`_land`: a token in its sequence, `_note`: a chunk's news for the
    request's timings, `_failed_row`: the request fails alone)."""

    states: dict[str, RequestState]
    _land: Callable[[RequestState, TokenSequence, int, int, TokenLogprob | None, bool], None]
    _note: Callable[[RequestState, ScheduledChunk, float], None]
    _failed_row: Callable[[RequestState, Exception], None]


def land_plain_rows(
    update: RowUpdate, plan: StepPlan, out: StepOutput, scheduled_at: float, held: bool
) -> list[RequestState]:
    moved: list[RequestState] = []
    states, finished = update.states, RequestStatus.FINISHED
    tokens, logprobs, land, note = out.tokens, out.logprobs, update._land, update._note
    chunks, steady = plan.chunks, plan.steady
    if type(chunks) is DecodeColumns:  # by index: row i is request i, seq i, one token
        rows = zip(chunks.requests, chunks.seqs, [s + 1 for s in chunks.starts], strict=True)
    else:  # chunk i's draw is i (StepPlan.plain)
        rows = ((c.request, c.seq, c.seq_len) for c in chunks)
    for i, (request, seq, at) in enumerate(rows):
        if request.status is finished:  # ended before this update: its row is discarded
            continue
        state = states[request.request_id]
        try:
            land(state, seq, at, tokens[i], logprobs[i], held)
        except Exception as exc:
            update._failed_row(state, exc)
        if not steady:  # a steady plan's rows have no news (StepPlan.steady)
            note(state, chunks[i], scheduled_at)
        moved.append(state)
    return moved
