"""RequestState: what the engine keeps per request beside the scheduler's token bookkeeping —
stop criteria, one incremental detokenizer per sequence (and for seeded requests the key of
each sequence's generator, which the runner floor keeps), the grammar matchers of a structured-output request, the beam-search state of a
beam request, prompt logprobs, timings — and how it
becomes a `RequestOutput` of deltas: one `CompletionOutput` per returned sequence carrying what
is new since the previous output, with `index` and offsets (see engine/requests/outputs.py, and
parallel_sampling.select_outputs and beam_stream.BeamStream for n > 1 and beams).
"""

from __future__ import annotations

import time

from engine.decoding.beam_search import BeamSearch
from engine.decoding.beam_stream import BeamStream
from engine.decoding.detokenizer import IncrementalDetokenizer
from engine.decoding.grammar_matchers import SequenceMatchers
from engine.decoding.parallel_sampling import (
    is_parallel,
    keeps_best,
    row_params,
    select_outputs,
)
from engine.decoding.stop_checker import StopCriteria
from engine.grammar.grammar_compiler import CompiledGrammar
from engine.requests.outputs import CompletionOutput, RequestMetrics, RequestOutput, StepEvent
from engine.requests.plain_output import PlainOutput
from engine.requests.request import Request, RequestStatus, TokenSequence
from engine.sampling.step_io import Draw, PromptAsk, SeedKey
from engine.scheduling.scheduler import ScheduledChunk, Scheduler
from engine.types import TokenLogprob


class RequestState:
    def __init__(
        self,
        request: Request,
        tokenizer,
        eos_token_ids: tuple[int, ...],
        grammar: CompiledGrammar | None = None,
    ) -> None:
        self.request = request
        self.tokenizer = tokenizer
        self.criteria = StopCriteria.from_params(request.params, eos_token_ids)
        self.row_params = row_params(request.params)  # what the sampler sees for its rows
        # No text, no grammar: the ids and the length alone end a sequence (checked inline per
        # row, step_update.py): (every id that stops it, min_tokens, max_tokens); else None.
        c = self.criteria
        self.token_stops = (
            (c.stop_token_ids | c.eos_token_ids, c.min_tokens, c.max_tokens)
            if tokenizer is None and grammar is None
            else None
        )
        self.parallel = is_parallel(request.params)  # n > 1 / best_of: several sequences
        # One sequence, sampled (no beams): its rows take the common paths of a step.
        self.plain = not self.parallel and not request.params.use_beam_search
        p = request.params  # nothing reads its tokens' values between steps (step_pipeline.py)
        self.may_defer = (
            self.plain
            and grammar is None
            and p.prompt_logprobs is None
            and p.repetition_penalty == 1.0
            and not p.presence_penalty
            and not p.frequency_penalty
        )
        # Not read as a stream: no output between its first token's and its last (engine.py).
        self.quiet = not p.streamed
        self.quiet_since_first = False  # its first token's output went out
        self.last_draw: Draw | None = None  # a one-sequence request's last (step_update.py)
        self.beam: BeamSearch | None = None
        # An encoder-decoder's answer continues no text: its first space goes as decode drops it.
        self._without_context = bool(request.encoder_token_ids)
        # Structured outputs: one grammar matcher per sequence (grammar_matchers.py).
        self.grammar = SequenceMatchers(grammar) if grammar is not None else None
        self._beam_stream: BeamStream | None = None
        if request.params.use_beam_search:
            self.beam = BeamSearch(request.params, self.criteria, eos_token_ids)
            self._beam_stream = BeamStream(
                request.params, self.criteria, tokenizer, without_context=self._without_context
            )
        self._detokenizers: dict[int, IncrementalDetokenizer] = {}
        # Position p -> logprob of prompt token p given tokens < p (p >= 1).
        self._prompt_logprobs: dict[int, TokenLogprob] = {}
        # Sent, or never asked for: nothing more to send.
        self._prompt_logprobs_done = request.params.prompt_logprobs is None
        self._input_token_ids = request.input_token_ids  # (a tuple, never replaced)
        self._sent: dict[int, tuple[int, int]] = {}  # seq_id -> (tokens, chars) reported
        self._plain_tokens_sent = 0  # the same of a plain request's one sequence
        self._plain_chars_sent = 0
        self._wants_logprobs = request.params.logprobs is not None
        self.first_scheduled_time: float | None = None
        self.first_token_time: float | None = None
        self.finished_time: float | None = None
        self.error: str | None = None
        # The last one sent, while still true: the timings and events are set here only, and
        # each setter drops it (no per-step comparison of every field).
        self._metrics: RequestMetrics | None = None
        self.events: list[StepEvent] = []  # prefill chunks and preemptions, for traces
        self.preemptions_seen = 0  # the request's preemptions `note_chunk` has recorded

    def detokenizer(self, seq_id: int) -> IncrementalDetokenizer | None:
        if self.tokenizer is None:
            return None
        if seq_id not in self._detokenizers:
            self._detokenizers[seq_id] = IncrementalDetokenizer.from_params(
                self.tokenizer, self.request.params, without_context=self._without_context
            )
        return self._detokenizers[seq_id]

    def seed_key(self, seq_id: int) -> SeedKey | None:
        """Seeded requests draw from their own generator (one per sequence, kept by the runner
        floor across steps and preemptions until the request ends)."""
        seed = self.request.params.seed
        if seed is None:
            return None
        return SeedKey(self.request.request_id, seq_id, seed)

    # ----- prompt logprobs ------------------------------------------------------------------
    def wants_prompt_logprobs(self, chunk: ScheduledChunk) -> bool:
        k = self.request.params.prompt_logprobs
        return (
            k is not None
            and chunk.start < chunk.seq.num_prompt_tokens - 1
            and chunk.seq.seq_id == 0
        )

    def prompt_ask(self, chunk: ScheduledChunk, index: int) -> PromptAsk | None:
        """What the runner computes for chunk `index` of the step (when it asked): row r of
        the chunk predicts the prompt token at position start + r + 1."""
        prompt = self.request.prompt_token_ids
        last = min(chunk.start + chunk.num_new_tokens, len(prompt) - 1)  # rows predicting it
        if last <= chunk.start:
            return None
        top_n = self.request.params.prompt_logprobs or 0
        targets = tuple(prompt[chunk.start + 1 : last + 1])
        return PromptAsk(self.request.request_id, index, targets, top_n)

    def record_prompt_logprobs(self, chunk: ScheduledChunk, entries: tuple[TokenLogprob, ...]):
        """`entries`: the runner's answer to `prompt_ask`, one per predicted prompt token."""
        for r, entry in enumerate(entries):
            self._prompt_logprobs[chunk.start + r + 1] = entry

    # ----- timings --------------------------------------------------------------------------
    def mark_scheduled(self, now: float) -> bool:
        """True the first time only: the request's first chunk ran."""
        if self.first_scheduled_time is None:
            self.first_scheduled_time = now
            self._metrics = None
            return True
        return False

    def note_chunk(self, chunk: ScheduledChunk, now: float) -> None:
        """Records a chunk that computes prompt tokens (and a preemption that led to it)."""
        if self.request.num_preemptions > self.preemptions_seen:
            self.preemptions_seen = self.request.num_preemptions
            self.events.append(StepEvent("recompute_after_preemption", now, chunk.start))
            self._metrics = None
        prompt = chunk.seq.num_prompt_tokens
        if chunk.start < prompt and chunk.seq.seq_id == 0:  # forks share the first's prompt
            tokens = min(chunk.num_new_tokens, prompt - chunk.start)
            self.events.append(StepEvent("prefill_chunk", now, chunk.start, tokens))
            self._metrics = None

    def mark_token(self, now: float) -> None:
        if self.first_token_time is None:
            self.first_token_time = now
            self._metrics = None

    def mark_finished(self, now: float) -> None:
        self.finished_time = now
        self._metrics = None

    def fail(self, scheduler: Scheduler, message: str) -> None:
        """Ends the request with finish_reason "error" and `message`, freeing its blocks."""
        scheduler.finish(self.request, "error")
        self.error = message
        self.mark_finished(time.time())

    # ----- the output -----------------------------------------------------------------------
    def output(self) -> RequestOutput | PlainOutput:
        """What moved since the previous call (see outputs.py): deltas per index; a
        one-sequence request's as one `PlainOutput` (plain_output.py)."""
        request = self.request
        finished = request.status is RequestStatus.FINISHED  # (`is_finished`, once)
        metrics = self._metrics  # (the scheduler sets the cached prompt tokens at admission)
        if metrics is None or metrics.num_cached_prompt_tokens != request.num_cached_prompt_tokens:
            metrics = self._current_metrics()
        if self.plain:  # one sequence, index 0: select_outputs would keep it as is
            # `_delta(0, seq)` inline (per row per step): its sent counts in two fields, no
            # detokenizer looked up when the request has none.
            seq = request.seqs[0]
            sent_tokens, sent_chars = self._plain_tokens_sent, self._plain_chars_sent
            new_ids = tuple(seq.token_ids[seq.num_prompt_tokens + sent_tokens :])
            self._plain_tokens_sent = sent_tokens + len(new_ids)
            text = ""
            if self._detokenizers and (detok := self._detok_done(seq)) is not None:
                text = detok.take_new_text()
                self._plain_chars_sent = sent_chars + len(text)
            return PlainOutput(  # positional: once per request per step, keywords cost more
                request.request_id,
                self._input_token_ids,
                text,
                new_ids,
                seq.cumulative_logprob,
                tuple(seq.logprobs[sent_tokens:]) if self._wants_logprobs else None,
                seq.finish_reason,
                seq.stop_reason,
                sent_chars,
                sent_tokens,
                finished,
                None if self._prompt_logprobs_done else self._take_prompt_logprobs(),
                metrics,
                self.error,
            )
        if self.beam is not None and self._beam_stream is not None:
            completions = self._beam_stream.outputs(request, self.beam)
        elif finished and keeps_best(request.params) and len(request.seqs) > 1:
            completions = select_outputs(
                [self._whole(i, s) for i, s in enumerate(request.seqs)], request.params, True
            )
        else:
            completions = select_outputs(
                [self._delta(i, seq) for i, seq in enumerate(request.seqs)],
                request.params,
                finished,
            )
        return RequestOutput(  # positional: once per request per step, keywords cost more
            request.request_id,
            self._input_token_ids,
            completions,
            finished,
            None if self._prompt_logprobs_done else self._take_prompt_logprobs(),
            metrics,
            self.error,
        )

    def _current_metrics(self) -> RequestMetrics:
        """The request's timings now (`output` sends the last one again while it holds)."""
        request = self.request
        metrics = self._metrics = RequestMetrics(
            arrival_time=request.arrival_time,
            first_scheduled_time=self.first_scheduled_time,
            first_token_time=self.first_token_time,
            finished_time=self.finished_time,
            num_cached_prompt_tokens=request.num_cached_prompt_tokens,
            events=tuple(self.events),
        )
        return metrics

    def _take_prompt_logprobs(self) -> tuple[TokenLogprob | None, ...] | None:
        """All prompt logprobs, once: in the first output after the prompt was computed."""
        if self._prompt_logprobs_done:
            return None
        prompt = self.request.prompt_token_ids
        if len(self._prompt_logprobs) < len(prompt) - 1 and not self.request.is_finished:
            return None
        self._prompt_logprobs_done = True
        return (None,) + tuple(self._prompt_logprobs.get(p) for p in range(1, len(prompt)))

    def _detok_done(self, seq: TokenSequence) -> IncrementalDetokenizer | None:
        if not self._detokenizers:  # no tokenizer, or no token yet
            return None
        detok = self._detokenizers.get(seq.seq_id)
        if detok is not None and seq.is_finished and not detok.finished:
            detok.finish()  # aborted / failed: release the held-back text
        return detok

    def _delta(self, index: int, seq: TokenSequence) -> CompletionOutput:
        """The tokens and text of `seq` not reported yet (O(new tokens))."""
        detok = self._detok_done(seq)
        sent_tokens, sent_chars = self._sent.get(seq.seq_id, (0, 0))
        text = detok.take_new_text() if detok is not None else ""
        new_ids = seq.token_ids[seq.num_prompt_tokens + sent_tokens :]
        self._sent[seq.seq_id] = (sent_tokens + len(new_ids), sent_chars + len(text))
        return CompletionOutput(  # positional: once per sequence per step, keywords cost more
            index,
            text,
            tuple(new_ids),
            seq.cumulative_logprob,
            tuple(seq.logprobs[sent_tokens:]) if self.request.params.logprobs is not None else None,
            seq.finish_reason,
            seq.stop_reason,
            sent_chars,  # text_offset
            sent_tokens,  # token_offset
        )

    def _whole(self, index: int, seq: TokenSequence) -> CompletionOutput:
        """All of `seq` from offset 0 (the finished output of a best_of > n request)."""
        detok = self._detok_done(seq)
        return CompletionOutput(
            index=index,
            text=detok.text if detok is not None else "",
            token_ids=seq.output_token_ids,
            cumulative_logprob=seq.cumulative_logprob,
            logprobs=tuple(seq.logprobs) if self.request.params.logprobs is not None else None,
            finish_reason=seq.finish_reason,
            stop_reason=seq.stop_reason,
        )
