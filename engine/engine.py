"""Engine: the synchronous heart. `step()` = schedule -> execute -> sample -> update.

Contract:
- It implements `engine.api.EngineCore`: `new_request` validates once (`InvalidRequest`, a
  ValueError naming the request field, with a message a user can act on) and `add` queues (`QueueFullError` when the queue is full);
  `add_request(request_id, prompt_token_ids, params)` is both; `abort_request(id)` takes effect
  at the next step. `info` holds the facts a server reads (`engine.api.EngineInfo`).
- `step()` returns one `RequestOutput` of deltas (outputs.py) per request that moved (new
  tokens, finished, aborted, failed). Every admitted request ends with exactly one finished output.
- `generate(prompts, params)` runs an offline batch to completion and returns whole outputs.
- One request -> `n` `CompletionOutput`s with `index`: n > 1 / best_of sample independent
  sequences forked from the prompt (parallel_sampling.py); `use_beam_search` runs best_of (or n)
  beams and returns the n best hypotheses (beam_search.py). Both share KV blocks by fork.
Per-request text state (detokenizer, stop criteria, seeded generators, beam state) lives here;
the token and block bookkeeping lives in the scheduler.
"""

from __future__ import annotations

import dataclasses
import logging
import time
from collections.abc import Callable
from collections.abc import Sequence as Seq

import torch

from engine.api import EngineInfo
from engine.config import EngineConfig
from engine.decoding.beam_search import check_beam_params
from engine.decoding.parallel_sampling import SampleTarget, sample_targets
from engine.decoding.stop_checker import finish_after_token
from engine.description import EngineDescription, describe_runner
from engine.encoder_decoder import EncoderLayout, check_encoder_decoder_params
from engine.faults import apply_faults
from engine.host_transfer import to_device
from engine.model_runner import ModelRunner, StepLogits
from engine.request_errors import InvalidRequest
from engine.requests.outputs import OutputAccumulator, RequestOutput
from engine.requests.request import Request, TokenSequence
from engine.requests.request_state import RequestState
from engine.sampling.grammar_engine import NO_TOKENIZER, GrammarEngine
from engine.sampling.grammar_masker import PendingMask
from engine.sampling.sampler import Sampler
from engine.sampling.sampling_batch import SamplingRow
from engine.sampling.sampling_params import SamplingParams
from engine.sampling.token_mask import TokenMask
from engine.scheduling.admission_check import check_admissible, check_request
from engine.scheduling.scheduler import Scheduler, SchedulerOutput
from engine.stats import EngineStats, StepTimings

log = logging.getLogger("tgserve.engine")


class Engine:
    def __init__(
        self,
        runner: ModelRunner,
        scheduler: Scheduler,
        tokenizer,
        config: EngineConfig,
        model_name: str,
        eos_token_ids: tuple[int, ...],
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.tokenizer = tokenizer  # None: the model's vocabulary has no tiktoken form
        self.config = config
        self.model_config = runner.config
        self.eos_token_ids = eos_token_ids
        usage = scheduler.stats().blocks
        self.info = EngineInfo(
            model_name=model_name,
            tokenizer=tokenizer,
            max_model_len=scheduler.max_model_len,
            kv_blocks_total=usage.num_blocks,
            kv_block_size=config.block_size,
            # Ids past the tokenizer (padded embedding rows) are nothing a prompt can hold.
            vocab_size=runner.sampleable_vocab or runner.config.vocab_size,
        )
        self.sampler = Sampler(eos_token_ids, seed=config.seed, device=runner.device)
        # Structured outputs (None: no tokenizer, so requests with a grammar are refused).
        self.grammars = GrammarEngine.for_tokenizer(tokenizer, self.info.vocab_size, eos_token_ids)
        # Unseeded beam sampling draws from this one (seeded requests own their generator).
        self._beam_generator = torch.Generator(device=runner.device).manual_seed(config.seed)
        self._states: dict[str, RequestState] = {}
        self._prompt_tokens_total = 0
        self._generation_tokens_total = 0
        self._num_steps = 0
        self._timings = StepTimings(scheduler.cost_model)  # teaches the step-time target
        # T5 / BART: a prompt is the encoder's input, laid out as engine/encoder_decoder.py says.
        self._encoder_layout = (
            EncoderLayout(self.model_config, config.block_size)
            if self.model_config.is_encoder_decoder
            else None
        )

    @classmethod
    def from_model(
        cls,
        model_path: str | None = None,
        config: EngineConfig | None = None,
        progress: bool = False,
    ) -> Engine:
        from engine.engine_factory import build_engine

        return build_engine(cls, model_path, config or EngineConfig(), progress)

    @classmethod
    def from_random_weights(
        cls, name: str, hf_config: dict, config: EngineConfig | None = None, tokenizer=None
    ) -> Engine:
        """The shape `hf_config` (config.json dict) describes, seeded random weights
        (`config.seed`), no tokenizer unless one is given: for benchmarks (bench's
        `--model random:NAME`)."""
        from engine.engine_factory import build_engine

        config = config or EngineConfig()
        return build_engine(cls, name, config, False, random_weights=hf_config, tokenizer=tokenizer)

    # ----- intake ---------------------------------------------------------------------------
    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Seq[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> Request:
        """Validates a request (ValueError if it could never be served) and builds it, with
        `max_tokens=None` filled in; changes nothing, so any thread may call it."""
        check_request(prompt_token_ids, params, self.info.vocab_size, self.tokenizer is not None)
        num_encoder_tokens = 0
        if self._encoder_layout is not None:
            check_encoder_decoder_params(params)
            num_encoder_tokens = len(prompt_token_ids)
            prompt_token_ids = self._encoder_layout.prompt(prompt_token_ids)
        if params.use_beam_search:
            check_beam_params(params)
        if params.structured_output is not None:  # compiled (and cached) now: a bad one is a 400
            if self.grammars is None:
                raise InvalidRequest("structured_output", f"structured_output: {NO_TOKENIZER}")
            try:
                self.grammars.compile(params)
            except ValueError as exc:  # the server names the API field it came from
                raise InvalidRequest("structured_output", f"structured_output: {exc}") from None
        if params.max_tokens is None:
            params = dataclasses.replace(
                params, max_tokens=self.info.default_max_tokens(len(prompt_token_ids))
            )
        sched = self.scheduler
        check_admissible(
            len(prompt_token_ids),
            params,
            request_id,
            sched.max_model_len,
            self.config.max_num_seqs,
            sched.block_manager,
        )
        return Request(
            request_id,
            tuple(prompt_token_ids),
            params,
            arrival_time or time.time(),
            num_encoder_tokens=num_encoder_tokens,
        )

    def add(self, request: Request) -> None:
        """Queues a request made by `new_request` (QueueFullError when the queue is full)."""
        if request.request_id in self._states:
            raise ValueError(
                f"request id {request.request_id!r} is already in use; ids must be unique"
            )
        grammar = self.grammars.compile(request.params) if self.grammars is not None else None
        self.scheduler.add_request(request)
        self._states[request.request_id] = RequestState(
            request, self.tokenizer, self.eos_token_ids, self.runner.device, grammar
        )

    def add_request(
        self,
        request_id: str,
        prompt_token_ids: Seq[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> None:
        self.add(self.new_request(request_id, prompt_token_ids, params, arrival_time))

    def abort_request(self, request_id: str) -> None:
        """Takes effect at the next step; unknown or finished ids are ignored."""
        state = self._states.get(request_id)
        if state is not None:
            self.scheduler.abort(state.request)

    def get_request(self, request_id: str) -> Request | None:
        """The live request with this id (its sequences, blocks, preemption count), or None."""
        state = self._states.get(request_id)
        return state.request if state is not None else None

    def has_unfinished_requests(self) -> bool:
        return self.scheduler.has_work()

    # ----- the step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """schedule -> execute -> sample -> update; the outputs of the requests that moved."""
        start = time.perf_counter()
        if self.runner.pending_path is not None and not self._any_request_started():
            self._switch_forward_path()
        sched = self.scheduler.schedule()
        scheduled_at = time.time()  # a request's queue time ends here, before its forward runs
        self._num_steps += 1
        outputs = [self._states.pop(rid).output() for rid in sched.aborted if rid in self._states]
        if sched.preempted:  # by recompute: they resume from the waiting queue
            log.debug("preempted %s (KV cache full)", ", ".join(sched.preempted))
        if sched.is_empty:
            return outputs
        try:
            logits, grammar = self._execute(sched)
            moved = self._sample_and_update(sched, logits, grammar, scheduled_at)
        except Exception as exc:  # a failed forward ends its requests, never the engine
            log.exception("engine step failed")
            return outputs + self._fail(sched, exc)
        self._timings.record(sched, time.perf_counter() - start)  # what a stream's ITL sees
        return outputs + self._emit(apply_faults(self.scheduler, moved))  # tests' params.fault

    def _any_request_started(self) -> bool:
        """True when a live request has K/V in the cache or tokens out (preempted ones too)."""
        return any(
            seq.num_computed_tokens or seq.num_output_tokens
            for state in self._states.values()
            for seq in state.request.seqs
        )

    def _switch_forward_path(self) -> None:
        """The C++ kernels built in the background (engine/kernel_switch.py) serve from this
        step on, if ready. Only between requests: the paths agree to rounding, not bit for bit,
        so cached prefixes (K/V of the old path) are dropped too."""
        if self.runner.switch_to_pending_path():
            self.scheduler.block_manager.forget_cached_blocks()

    def _execute(self, sched: SchedulerOutput) -> tuple[StepLogits, TokenMask | None]:
        """One forward over every scheduled chunk; afterwards their tokens are in the KV cache.
        The grammar masks of the rows to sample are computed meanwhile on a worker thread."""
        full_rows = frozenset(
            i
            for i, c in enumerate(sched.chunks)
            if self._states[c.request.request_id].wants_prompt_logprobs(c)
        )
        pending = self._start_grammar_masks(sched)
        try:
            logits = self.runner.execute(sched.chunks, sched.block_copies, full_rows)
        finally:  # wait even when the forward failed: the matchers are the engine's again
            grammar = pending.result() if pending is not None else None
        self.scheduler.on_step_done(sched)
        return logits, grammar

    def _start_grammar_masks(self, sched: SchedulerOutput) -> PendingMask | None:
        if self.grammars is None:
            return None
        jobs = []
        for row, chunk in enumerate(c for c in sched.chunks if c.sample):
            matchers = self._states[chunk.request.request_id].grammar
            if matchers is not None:
                jobs.append((row, matchers.matcher(chunk.seq)))
        return self.grammars.start_masks(jobs)

    def _sample_and_update(
        self,
        sched: SchedulerOutput,
        logits: StepLogits,
        grammar: TokenMask | None,
        scheduled_at: float,
    ) -> list[RequestState]:
        """Prompt logprobs; one token per sampled sequence (parallel groups fork on their first
        token); one beam-search step per beam group. Row i of `logits.sampling` (and of the
        grammar masks) belongs to the i-th chunk with `sample=True`. `scheduled_at`: when this
        step was scheduled (before its forward), a request's first-scheduled time."""
        moved: dict[str, RequestState] = {}
        for i, rows in logits.all_rows.items():
            state = self._states[sched.chunks[i].request.request_id]
            state.record_prompt_logprobs(sched.chunks[i], rows)
            moved[state.request.request_id] = state
        targets: list[SampleTarget] = []
        beam_groups: dict[str, list[tuple[TokenSequence, int]]] = {}
        for row, chunk in enumerate(c for c in sched.chunks if c.sample):
            if chunk.request.params.use_beam_search:
                beam_groups.setdefault(chunk.request.request_id, []).append((chunk.seq, row))
            else:
                targets += sample_targets(self.scheduler, chunk, row)
        self._sample(targets, logits.sampling, grammar)
        for rid, group in beam_groups.items():
            self._beam_step(self._states[rid], group, logits.sampling, grammar)
        for chunk in sched.chunks:  # prefill chunks that did not sample yet still started
            state = self._states[chunk.request.request_id]
            if state.mark_scheduled(scheduled_at):  # counted once, at first scheduling (as vLLM)
                self._prompt_tokens_total += len(state.request.prompt_token_ids)
            if chunk.sample:
                moved[chunk.request.request_id] = state
        return list(moved.values())

    def _sample(
        self, targets: list[SampleTarget], logits: torch.Tensor, grammar: TokenMask | None
    ) -> None:
        if not targets:
            return
        target_rows = [t.row for t in targets]
        if target_rows != list(range(logits.shape[0])):  # forks reuse a row
            logits = logits[to_device(target_rows, torch.int64, logits.device)]
        rows = [self._sampling_row(t) for t in targets]
        result = self.sampler(
            logits, rows, grammar.select(target_rows) if grammar is not None else None
        )
        for target, token, entry in zip(targets, result.token_ids, result.logprobs, strict=True):
            self._append(self._states[target.request.request_id], target.seq, token, entry)

    def _sampling_row(self, target: SampleTarget) -> SamplingRow:
        seq, state = target.seq, self._states[target.request.request_id]
        params = state.row_params
        return SamplingRow(
            params=params,
            # Only the repetition penalty reads the prompt: skip copying it every step otherwise.
            prompt_token_ids=seq.prompt_token_ids if params.repetition_penalty != 1.0 else (),
            output_token_ids=seq.output_view(),
            generator=state.generator(seq.seq_id),
        )

    def _append(self, state: RequestState, seq: TokenSequence, token: int, entry) -> None:
        seq.append_token(token, entry.logprob if entry is not None else 0.0, entry)
        self._generation_tokens_total += 1
        state.mark_token(time.time())
        finish = finish_after_token(
            state.criteria, state.detokenizer(seq.seq_id), token, seq.num_output_tokens
        )
        reason, stop_reason = (finish.reason, finish.stop_reason) if finish else (None, None)
        # A grammar that is complete and allows nothing more ends the sequence: "stop" (also
        # when that happens on the last allowed token).
        if state.grammar is not None and reason in (None, "length") and state.grammar.advance(seq):
            reason, stop_reason = "stop", None
        if reason is not None:
            self.scheduler.finish_seq(state.request, seq, reason, stop_reason)
            if state.request.is_finished:
                state.mark_finished(time.time())

    def _beam_step(
        self,
        state: RequestState,
        group: list[tuple[TokenSequence, int]],
        logits: torch.Tensor,
        grammar: TokenMask | None,
    ) -> None:
        rows = [row for _, row in group]
        generator = state.generator(0)  # beam sampling draws once per group and step
        if generator is None:
            generator = self._beam_generator
        beams = [seq for seq, _ in group]
        mask = grammar.select(rows) if grammar is not None else None
        logits = logits[to_device(rows, torch.int64, logits.device)]
        moved = state.beam.step(self.scheduler, state.request, beams, logits, generator, mask)
        if state.grammar is not None:
            state.grammar.follow_beams(moved, state.request.live_seqs)
        self._generation_tokens_total += len(group)
        state.mark_token(time.time())
        if state.request.is_finished:
            state.mark_finished(time.time())

    def _emit(self, moved: list[RequestState]) -> list[RequestOutput]:
        outputs = [state.output() for state in moved]
        for state in moved:
            if state.request.is_finished:
                del self._states[state.request.request_id]
        return outputs

    def _fail(self, sched: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        failed = []
        for rid in dict.fromkeys(c.request.request_id for c in sched.chunks):
            state = self._states.pop(rid)
            state.fail(self.scheduler, f"internal error during generation: {type(exc).__name__}")
            failed.append(state.output())
        return failed

    # ----- offline and stats ----------------------------------------------------------------
    def generate(
        self,
        prompts: Seq[str] | Seq[Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Runs a batch to completion; outputs in prompt order. Nobody reads these tokens as
        they come, so the requests are not streamed (`SamplingParams.streamed` False): the
        step-time target does not hold their steps back."""
        params_list = (
            list(params)
            if isinstance(params, list | tuple)
            else [params or SamplingParams()] * len(prompts)
        )
        if len(params_list) != len(prompts):
            raise ValueError(f"got {len(params_list)} SamplingParams for {len(prompts)} prompts")
        ids = []
        for i, (prompt, p) in enumerate(zip(prompts, params_list, strict=True)):
            if isinstance(prompt, str):
                if self.tokenizer is None:
                    raise ValueError("text prompts need a tokenizer; pass token ids")
                prompt = self.tokenizer.encode(prompt, add_special_tokens=True)
            rid = f"offline-{self._num_steps}-{i}"
            self.add_request(rid, prompt, dataclasses.replace(p, streamed=False))
            ids.append(rid)
        partial = {rid: OutputAccumulator() for rid in ids}
        finals: dict[str, RequestOutput] = {}
        while len(finals) < len(ids):
            for out in self.step():
                if out.request_id not in partial:  # added before, by someone else
                    continue
                partial[out.request_id].add(out)
                if out.finished:
                    finals[out.request_id] = partial[out.request_id].result()
        return [finals[rid] for rid in ids]

    # ----- lifetime (tensor parallel: the other ranks' processes) -------------------------
    def watch_failures(self, on_failure: Callable[[str], None]) -> None:
        """`on_failure(reason)` once if another tensor-parallel rank dies (never without TP)."""
        self.runner.watch_failures(on_failure)

    def close(self) -> None:
        """Stops the other tensor-parallel ranks (no-op without TP); on the engine's thread."""
        self.runner.close()

    def describe(self) -> EngineDescription:
        """What this engine runs and holds (forward path, graphs, held bytes; description.py)."""
        return describe_runner(self.runner)

    def stats(self) -> EngineStats:
        s = self.scheduler.stats()
        return EngineStats(
            num_running=s.num_running,
            num_waiting=s.num_waiting,
            kv_blocks_used=s.blocks.num_used,
            kv_blocks_total=s.blocks.num_blocks,
            kv_block_size=self.config.block_size,
            prefix_cache_queries=s.blocks.prefix_cache_queries,
            prefix_cache_hits=s.blocks.prefix_cache_hits,
            num_preemptions=s.num_preemptions,
            prompt_tokens_total=self._prompt_tokens_total,
            generation_tokens_total=self._generation_tokens_total,
            num_steps=self._num_steps,
            step_seconds=self._timings.step_seconds(),
            prefill_tokens_per_step=self._timings.prefill_tokens(),
            prefill_chunk_tokens=s.prefill_capacity,
            forward_path=self.runner.forward_path.description,
            cpu_kernels_active=self.runner.cpu_kernels,
        )
