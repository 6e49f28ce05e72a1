"""A deterministic stand-in for engine.engine.Engine, for fast server and AsyncEngine tests.

It implements `engine.EngineCore`, the API the server relies on (info, new_request, add,
abort_request, step, has_unfinished_requests, stats; a test checks it), with a byte-level fake
tokenizer, and emits deltas as the real engine does. Generation is a pure function of (prompt, position, sequence index)
for greedy requests, so expected texts can be computed independently by `expected_greedy_text`.
`script` (prompt text -> answer text) makes every sequence write that answer's bytes, then EOS,
whatever its sampling: a model whose answer a test chooses (tool calls, reasoning).
Knobs for tests: `step_delay` (seconds per step), `fail_steps` (next N steps raise),
`stall` (a threading.Event: while set, step() blocks), `num_blocks`. It honours
`SamplingParams.fault` as the real engine does (engine/faults.py).
"""

from __future__ import annotations

import dataclasses
import math
import random
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from engine import (
    CompletionOutput,
    EngineInfo,
    InvalidRequest,
    QueueFullError,
    Request,
    RequestMetrics,
    RequestOutput,
    SamplingParams,
    TokenLogprob,
)
from tests.server.fake_tokenizer import BOS, EOS, FakeTokenizer, expected_greedy_text, greedy_token

__all__ = ["BOS", "EOS", "FakeEngine", "FakeTokenizer", "expected_greedy_text"]


@dataclass(frozen=True)
class FakeStats:
    num_running: int
    num_waiting: int
    kv_blocks_used: int
    kv_blocks_total: int
    kv_block_size: int
    prefix_cache_queries: int = 0
    prefix_cache_hits: int = 0
    num_preemptions: int = 0
    prompt_tokens_total: int = 0
    generation_tokens_total: int = 0
    num_steps: int = 0
    forward_path: str = "fake engine"
    cpu_kernels_active: bool = False
    grammar_cache_bytes: int = 0


@dataclass
class _Seq:
    index: int
    tokens: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: int | str | None = None
    text: str = ""
    sent_tokens: int = 0  # reported in earlier outputs
    sent_chars: int = 0


@dataclass
class _Req:
    request_id: str
    prompt: list[int]
    params: SamplingParams
    arrival: float
    seqs: list[_Seq]
    rng: random.Random
    aborted: bool = False
    first_token_time: float | None = None
    prompt_logprobs_sent: bool = False
    error: str | None = None


class FakeEngine:
    def __init__(
        self,
        max_model_len: int = 128,
        max_num_seqs: int = 8,
        max_queued_requests: int = 16,
        num_blocks: int = 64,
        block_size: int = 4,
        step_delay: float = 0.002,
        script: Callable[[str], str] | None = None,
    ) -> None:
        self.tokenizer = FakeTokenizer()
        self.script = script
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_queued_requests = max_queued_requests
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.step_delay = step_delay
        self.fail_steps = 0
        self.stall = threading.Event()
        self.steps = 0
        self._waiting: deque[_Req] = deque()
        self._running: list[_Req] = []
        self._aborts: set[str] = set()
        self._prompt_total = 0
        self._gen_total = 0
        self.info = EngineInfo(
            model_name="fake-model",
            tokenizer=self.tokenizer,
            max_model_len=max_model_len,
            kv_blocks_total=num_blocks,
            kv_block_size=block_size,
            vocab_size=self.tokenizer.vocab_size,
        )

    # ---- validation / admission ----
    def new_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> Request:
        if not prompt_token_ids:
            raise InvalidRequest("prompt", "prompt must contain at least one token")
        for t in prompt_token_ids:
            if not 0 <= t < self.tokenizer.vocab_size:
                raise InvalidRequest("prompt", f"prompt token id {t} is outside the vocabulary")
        if params.max_tokens is None:
            params = dataclasses.replace(
                params, max_tokens=self.info.default_max_tokens(len(prompt_token_ids))
            )
        if len(prompt_token_ids) + params.max_tokens > self.max_model_len:
            raise InvalidRequest(
                "prompt" if len(prompt_token_ids) >= self.max_model_len else "max_tokens",
                f"the prompt ({len(prompt_token_ids)} tokens) plus max_tokens ({params.max_tokens}) "
                f"exceeds the context length ({self.max_model_len}); shorten the prompt or lower "
                "max_tokens",
            )
        if params.num_sequences > self.max_num_seqs:
            wide = "best_of" if params.best_of is not None else "n"
            raise InvalidRequest(wide, f"{wide} asks for more sequences than max_num_seqs")
        if params.use_beam_search and params.stop:
            raise InvalidRequest(
                "stop", "stop strings are not supported with beam search; use stop_token_ids"
            )
        params.validate_for_vocab(self.tokenizer.vocab_size)
        return Request(request_id, tuple(prompt_token_ids), params, time.monotonic())

    def add(self, request: Request) -> None:
        limit = self.max_num_seqs + self.max_queued_requests  # the engine's one rule
        if len(self._waiting) + len(self._running) >= limit:
            raise QueueFullError(f"{limit} requests in flight")
        params = request.params
        seqs = [_Seq(i) for i in range(params.n)]
        rng = random.Random(params.seed)
        self._waiting.append(
            _Req(
                request.request_id,
                list(request.prompt_token_ids),
                params,
                request.arrival_time,
                seqs,
                rng,
            )
        )

    def add_request(
        self, request_id: str, prompt_token_ids: list[int], params: SamplingParams
    ) -> None:
        self.add(self.new_request(request_id, prompt_token_ids, params))

    def abort_request(self, request_id: str) -> None:
        self._aborts.add(request_id)

    def has_unfinished_requests(self) -> bool:
        return bool(self._waiting or self._running)

    def _blocks(self, req: _Req) -> int:
        return sum(
            math.ceil((len(req.prompt) + len(s.tokens) + 1) / self.block_size) for s in req.seqs
        )

    def stats(self) -> FakeStats:
        return FakeStats(
            num_running=len(self._running),
            num_waiting=len(self._waiting),
            kv_blocks_used=sum(self._blocks(r) for r in self._running),
            kv_blocks_total=self.num_blocks,
            kv_block_size=self.block_size,
            prompt_tokens_total=self._prompt_total,
            generation_tokens_total=self._gen_total,
            num_steps=self.steps,
        )

    # ---- the step ----
    def step(self) -> list[RequestOutput]:
        while self.stall.is_set():
            time.sleep(0.005)
        self.steps += 1
        if self.fail_steps > 0:
            self.fail_steps -= 1
            raise RuntimeError("fake engine failure in /secret/path/model.py")
        time.sleep(self.step_delay)
        outputs = self._take_aborts()
        used = sum(self._blocks(r) for r in self._running)
        while self._waiting and len(self._running) < self.max_num_seqs:
            need = self._blocks(self._waiting[0])
            if used + need > self.num_blocks:
                break
            req = self._waiting.popleft()
            used += need
            self._prompt_total += len(req.prompt)
            self._running.append(req)
        for req in list(self._running):
            self._advance(req)
            done = all(s.finish_reason for s in req.seqs)
            outputs.append(self._snapshot(req, done))
            if done:
                self._running.remove(req)
        return outputs

    def _take_aborts(self) -> list[RequestOutput]:
        out = []
        for req in [*self._waiting, *self._running]:
            if req.request_id in self._aborts:
                for s in req.seqs:
                    s.finish_reason = s.finish_reason or "abort"
                out.append(self._snapshot(req, True))
                if req in self._running:
                    self._running.remove(req)
                else:
                    self._waiting.remove(req)
        self._aborts.clear()
        return out

    def _advance(self, req: _Req) -> None:
        if req.first_token_time is None:
            req.first_token_time = time.monotonic()
        p = req.params
        for s in req.seqs:
            if s.finish_reason:
                continue
            pos = len(s.tokens)
            if self.script is not None:
                token = self._scripted(req.prompt, pos)
            elif p.greedy:
                token = greedy_token(req.prompt, pos, s.index)
            else:
                token = req.rng.choice(range(ord("a"), ord("z") + 1))
            if b"EOS" in bytes(t for t in req.prompt if t < 256) and pos == 3 and not p.ignore_eos:
                token = EOS
            s.tokens.append(token)
            self._gen_total += 1
            if p.logprobs is not None:
                top = tuple((token + k if k else token, -0.5 - k) for k in range(p.logprobs))
                s.logprobs.append(TokenLogprob(token, -0.5, top))
            s.text = self.tokenizer.decode_stable(s.tokens)  # a cut character is dropped
            if token == EOS and not p.ignore_eos and pos + 1 >= p.min_tokens:
                s.finish_reason, s.stop_reason = "stop", EOS
            for stop in p.stop:
                if stop in s.text:
                    cut = s.text.index(stop) + (len(stop) if p.include_stop_str_in_output else 0)
                    s.text, s.finish_reason, s.stop_reason = s.text[:cut], "stop", stop
                    break
            if s.finish_reason is None and len(s.tokens) >= p.max_tokens:
                s.finish_reason = "length"
        self._apply_fault(req)

    def _scripted(self, prompt: list[int], position: int) -> int:
        text = bytes(t for t in prompt if t < 256).decode("utf-8", errors="replace")
        answer = self.script(text).encode()
        return answer[position] if position < len(answer) else EOS

    def _apply_fault(self, req: _Req) -> None:
        fault = req.params.fault
        if fault is None or all(s.finish_reason for s in req.seqs):
            return
        due = fault.due(max(len(s.tokens) for s in req.seqs))
        if due == "kill":
            raise fault.kill_error(req.request_id)
        if due == "fail":
            for s in req.seqs:
                s.finish_reason = s.finish_reason or "error"
            req.error = fault.error_message()

    def _snapshot(self, req: _Req, finished: bool) -> RequestOutput:
        """The deltas since the last snapshot, as the engine reports them."""
        p = req.params
        prompt_lp = None
        if p.prompt_logprobs is not None and not req.prompt_logprobs_sent:
            req.prompt_logprobs_sent = True
            prompt_lp = (None,) + tuple(TokenLogprob(t, -1.0) for t in req.prompt[1:])
        outs = tuple(self._delta(s, p) for s in req.seqs)
        now = time.monotonic()
        metrics = RequestMetrics(
            arrival_time=req.arrival,
            first_scheduled_time=req.first_token_time,
            first_token_time=req.first_token_time,
            finished_time=now if finished else None,
        )
        return RequestOutput(
            req.request_id, tuple(req.prompt), outs, finished, prompt_lp, metrics, req.error
        )

    def _delta(self, s: _Seq, p: SamplingParams) -> CompletionOutput:
        if len(s.text) < s.sent_chars:  # a stop string cut text already sent: restart from 0
            s.sent_chars = s.sent_tokens = 0
        out = CompletionOutput(
            index=s.index,
            text=s.text[s.sent_chars :],
            token_ids=tuple(s.tokens[s.sent_tokens :]),
            cumulative_logprob=-0.5 * len(s.tokens),
            logprobs=tuple(s.logprobs[s.sent_tokens :]) if p.logprobs is not None else None,
            finish_reason=s.finish_reason,
            stop_reason=s.stop_reason,
            text_offset=s.sent_chars,
            token_offset=s.sent_tokens,
        )
        s.sent_chars, s.sent_tokens = len(s.text), len(s.tokens)
        return out
