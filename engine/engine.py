"""Engine: the heart. `step()` = schedule -> execute (forward and sampling, below the runner:
plain host data back) -> update.

Contract:
- It implements `engine.api.EngineCore`: `new_request` validates once (`InvalidRequest`, a
  ValueError naming the request field, with a message a user can act on; intake.py) and `add`
  queues (`QueueFullError` when the queue is full); `add_request(request_id, prompt_token_ids,
  params)` is both; `abort_request(id)` takes effect at the next step. `info` holds the facts a
  server reads (`engine.api.EngineInfo`).
- `step()` returns one `RequestOutput` of deltas (outputs.py) per request that moved (new
  tokens, finished, aborted, failed), but for a request nobody reads as a stream
  (`SamplingParams.streamed` false) none between the one carrying its first token and its
  last (which carries all since: issue 38). Every admitted request ends with exactly one
  finished output. A failed forward ends that step's requests with "error", never the engine. With
  `EngineConfig.async_scheduling` the loop overlaps (step_pipeline.py): the outputs of a
  step come from the next `step()`, and a step may be scheduled before the previous one's
  tokens reach the host; the same outputs (`has_unfinished_requests` stays true until they
  are out).
- `generate(prompts, params)` runs an offline batch to completion: whole outputs (offline.py).
- One request -> `n` `CompletionOutput`s with `index`: n > 1 / best_of sample independent
  sequences forked from the prompt (parallel_sampling.py); `use_beam_search` runs best_of (or n)
  beams and returns the n best hypotheses (beam_search.py). Both share KV blocks by fork.
- `describe()` and `stats()` are what reports and metrics read; `watch_failures` and `close`
  are the tensor-parallel group's lifetime (engine/parallel/rank.py; no-ops without TP).
Per-request text state (detokenizer, stop criteria, beams) lives in `RequestState`s (updated
by step_update.py), the token and block bookkeeping in the scheduler.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from collections.abc import Sequence as Seq

from engine import offline
from engine.api import EngineInfo
from engine.config import EngineConfig
from engine.description import EngineDescription
from engine.encoder_layout import layout_for
from engine.grammar.grammar_engine import GrammarEngine
from engine.intake import RequestIntake
from engine.request_state import RequestState
from engine.requests.generation_defaults import GenerationDefaults
from engine.requests.outputs import RequestOutput
from engine.requests.request import Request, RequestStatus
from engine.requests.sampling_params import SamplingParams
from engine.runner import Runner
from engine.scheduling.scheduler import Scheduler, SchedulerOutput
from engine.scheduling.step_plan import Proposals
from engine.speculative.draft import DraftProposer
from engine.speculative.speculator import Speculator
from engine.stats import EngineStats, StepTimings
from engine.step_pipeline import StepPipeline
from engine.step_update import StepUpdate
from engine.tier_hooks import close_tiers, tier_stats

log = logging.getLogger("tgserve.engine")


class Engine:
    def __init__(
        self,
        runner: Runner,
        scheduler: Scheduler,
        tokenizer,
        config: EngineConfig,
        model_name: str,
        eos_token_ids: tuple[int, ...],
        draft: DraftProposer | None = None,
    ) -> None:
        self.runner = runner
        self.scheduler = scheduler
        self.tokenizer = tokenizer  # None: the model's vocabulary has no tiktoken form
        self.config = config
        self.eos_token_ids = eos_token_ids
        self.info = EngineInfo(
            model_name=model_name,
            tokenizer=tokenizer,
            max_model_len=scheduler.max_model_len,
            kv_blocks_total=scheduler.stats().blocks.num_blocks,
            kv_block_size=config.block_size,
            # Ids past the tokenizer (padded embedding rows) are nothing a prompt can hold.
            vocab_size=runner.vocab_size,
            encoder_decoder=runner.config.is_encoder_decoder,
            device=runner.device.type,
            generation=GenerationDefaults.from_file(runner.config.generation),
        )
        self.grammars = GrammarEngine.for_tokenizer(  # None: no tokenizer, grammars refused
            tokenizer, self.info.vocab_size, eos_token_ids, config.grammar_cache_bytes
        )
        # T5 / BART: a prompt is the encoder's input, laid out as engine/encoder_layout.py says.
        layout = layout_for(runner.config, config.block_size)
        self.intake = RequestIntake(  # with the runner's LoRA adapters (lora_adapters.py)
            self.info, self.grammars, config.max_num_seqs, scheduler.block_manager, layout, runner
        )
        self._states: dict[str, RequestState] = {}
        # Live requests with a `SamplingParams.fault` (faults.py; tests) and with a grammar: a
        # step's passes for them are skipped when there are none.
        self.num_faulty = self.num_structured = 0
        # Speculative decoding (engine/speculative; `draft`: the draft model's proposer).
        self.speculator = Speculator(config.speculative, draft) if config.speculative else None
        self.updater = StepUpdate(self._states, scheduler, eos_token_ids, self.speculator)
        self._released: list[str] = []  # ended requests whose generators the runner may drop
        self._pipeline = StepPipeline(self, config.async_scheduling)
        self._num_steps = 0
        self._timings = StepTimings(scheduler.cost_model)  # teaches the step-time target

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
        (`config.seed`), no tokenizer unless given: bench's `--model random:NAME`."""
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
        return self.intake.new_request(request_id, prompt_token_ids, params, arrival_time)

    def add(self, request: Request) -> None:
        """Queues a request made by `new_request` (QueueFullError when the queue is full)."""
        if request.request_id in self._states:
            raise ValueError(f"request id {request.request_id!r} is already in use (unique ids)")
        self.intake.adapters.admit(request, self.scheduler.add_request)  # a LoRA slot, queued
        state = RequestState(request, self.tokenizer, self.eos_token_ids, request.grammar)
        self._states[request.request_id] = state
        self.num_faulty += request.params.fault is not None
        self.num_structured += state.grammar is not None

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
        return self.scheduler.has_work() or self._pipeline.busy

    # ----- the step -------------------------------------------------------------------------
    def step(self) -> list[RequestOutput]:
        """schedule -> execute -> update; the outputs of the requests that moved. With
        `async_scheduling`, those of the previous step, built while this one runs, and the
        step may run on before its tokens reach the host (step_pipeline.py)."""
        return self._pipeline.step()

    def _idle(self) -> bool:
        """No live request has K/V or tokens out: the runner may change how it runs now."""
        return not any(
            seq.num_computed_tokens or seq.num_output_tokens
            for state in self._states.values()
            for seq in state.request.seqs
        )

    def _propose(self) -> None:
        """After a step, the proposals for the next go to the scheduler as data (speculator.py)."""
        if self.speculator is not None:
            wanted = [
                (state.request, seq, state.grammar and state.grammar.matcher(seq))
                for state in self._states.values()
                for seq in state.request.awaiting_decode()
            ]
            self.scheduler.take_proposals(Proposals.of(self.speculator.propose_all(wanted)))

    def _emit(self, moved: list[RequestState]) -> list[RequestOutput]:
        """The outputs of the requests that moved. One nobody reads as a stream (`SamplingParams
        .streamed` false: offline batches, whole-output routes) has outputs until the one that
        carries its first token, then only its last, whose delta holds everything since."""
        outputs, finished = [], RequestStatus.FINISHED
        for state in moved:  # a finished request's state leaves; its output is its own
            if state.request.status is finished:
                self._pop(state.request.request_id)
            elif state.quiet and state.first_token_time is not None:
                if state.quiet_since_first:
                    continue
                state.quiet_since_first = True
            outputs.append(state.output())
        return outputs

    def _pop(self, request_id: str) -> RequestState:
        """A request leaves: its generators go with the next step's inputs."""
        self._released.append(request_id)
        state = self._states.pop(request_id)
        self.num_faulty -= state.request.params.fault is not None
        self.num_structured -= state.grammar is not None
        return state

    def _fail(self, sched: SchedulerOutput, exc: Exception) -> list[RequestOutput]:
        failed = []
        for rid in dict.fromkeys(c.request.request_id for c in sched.chunks):
            if rid not in self._states:  # ended already (the overlapped loop's held step)
                continue
            state = self._pop(rid)
            state.fail(self.scheduler, f"internal error during generation: {type(exc).__name__}")
            failed.append(state.output())
        return failed

    # ----- offline, reports, lifetime -------------------------------------------------------
    def generate(
        self,
        prompts: Seq[str] | Seq[Seq[int]],
        params: SamplingParams | Seq[SamplingParams] | None = None,
    ) -> list[RequestOutput]:
        """Runs a batch to completion, not streamed; outputs in prompt order (offline.py)."""
        return offline.generate(self, prompts, params)

    def describe(self) -> EngineDescription:
        """What this engine runs and holds (forward path, graphs, held bytes; description.py)."""
        return self.runner.describe()

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
            prompt_tokens_total=self.updater.prompt_tokens_total,
            generation_tokens_total=self.updater.generation_tokens_total,
            num_steps=self._num_steps,
            step_seconds=self._timings.step_seconds(),
            prefill_tokens_per_step=self._timings.prefill_tokens(),
            prefill_chunk_tokens=s.prefill_capacity,
            forward_path=self.runner.forward_path.description,
            cpu_kernels_active=self.runner.forward_path.attention_kernel,
            speculation=self.speculator.counters.snapshot() if self.speculator else None,
            grammar_cache_bytes=self.grammars.cache_bytes_held if self.grammars else 0,
            kv_tiers=tier_stats(self.scheduler.block_manager),
        )

    def watch_failures(self, on_failure: Callable[[str], None]) -> None:
        """`on_failure(reason)` once if another tensor-parallel rank dies (never without TP)."""
        self.runner.watch_failures(on_failure)

    def close(self) -> None:
        """K/V tier writes land, other tensor-parallel ranks stop (if any); engine's thread."""
        close_tiers(self.scheduler.block_manager, self.runner)
        self.runner.close()
