"""RequestIntake: where a request enters the engine, validated once.

Contract: `new_request(request_id, prompt_token_ids, params, arrival_time)` raises
`InvalidRequest` (a ValueError naming the request field, with a message a user can act on) for a
request that could never be served — its prompt and token ids, beam rules, a structured output
that does not compile, its shape against the context, `max_num_seqs` and the KV cache — and
otherwise returns the `Request`, with `max_tokens=None` filled in as the room left in the
context and its compiled grammar in `Request.grammar` (compiled last, after the cheap checks,
so a request refused for its length never pays for its grammar). It changes nothing, so any thread
may call it. With an `EncoderLayout` (T5, BART) the prompt is the encoder's input and the
`Request` starts with its layout (engine/encoder_layout.py); prompt logprobs are refused.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence

from engine.api import EngineInfo
from engine.decoding.beam_search import check_beam_params
from engine.encoder_layout import EncoderLayout
from engine.errors import InvalidRequest
from engine.grammar.grammar_compiler import CompiledGrammar
from engine.grammar.grammar_engine import NO_TOKENIZER, GrammarEngine
from engine.lora_adapters import LoraAdapters
from engine.requests.request import Request
from engine.requests.sampling_params import SamplingParams
from engine.scheduling.admission_check import check_admissible, check_request
from engine.scheduling.block_manager import BlockManager


class RequestIntake:
    def __init__(
        self,
        info: EngineInfo,
        grammars: GrammarEngine | None,
        max_num_seqs: int,
        block_manager: BlockManager,
        encoder_layout: EncoderLayout | None = None,
        runner: object = None,
    ) -> None:
        """`runner`: its LoRA bank serves the adapters `params.adapter` names (none without)."""
        self.info = info
        self.grammars = grammars  # None: no tokenizer, so requests with a grammar are refused
        self.max_num_seqs = max_num_seqs
        self.block_manager = block_manager
        self.encoder_layout = encoder_layout
        self.adapters = LoraAdapters.for_runner(runner)  # by name (engine/lora_adapters.py)

    def new_request(
        self,
        request_id: str,
        prompt_token_ids: Sequence[int],
        params: SamplingParams,
        arrival_time: float | None = None,
    ) -> Request:
        info = self.info
        name = params.adapter
        if name is not None and not self.adapters.known(name):
            raise InvalidRequest("adapter", f"model {name!r} is not a LoRA adapter being served")
        check_request(prompt_token_ids, params, info.vocab_size, info.tokenizer is not None)
        encoder_ids: tuple[int, ...] = ()
        decoder_start = 0
        if self.encoder_layout is not None:
            _check_encoder_decoder_params(params)
            encoder_ids = tuple(prompt_token_ids)
            decoder_start = self.encoder_layout.region(len(encoder_ids))
            prompt_token_ids = self.encoder_layout.prompt(encoder_ids)
        if params.use_beam_search:
            check_beam_params(params)
        if params.max_tokens is None:
            decoder_prompt = len(prompt_token_ids) - decoder_start
            max_tokens = info.default_max_tokens(len(prompt_token_ids), decoder_prompt)
            params = dataclasses.replace(params, max_tokens=max_tokens)
        check_admissible(
            len(prompt_token_ids),
            params,
            request_id,
            info.max_model_len,
            self.max_num_seqs,
            self.block_manager,
        )
        # Last: its cost is the request's choice; a request refused anyway never pays it.
        grammar = self._compile_grammar(params) if params.structured_output is not None else None
        return Request(
            request_id,
            tuple(prompt_token_ids),
            params,
            arrival_time or time.time(),
            encoder_token_ids=encoder_ids,
            decoder_start=decoder_start,
            grammar=grammar,
        )

    def _compile_grammar(self, params: SamplingParams) -> CompiledGrammar | None:
        if self.grammars is None:
            raise InvalidRequest("structured_output", f"structured_output: {NO_TOKENIZER}")
        try:
            return self.grammars.compile(params)
        except ValueError as exc:  # the server names the API field it came from
            raise InvalidRequest("structured_output", f"structured_output: {exc}") from None


def _check_encoder_decoder_params(params: SamplingParams) -> None:
    if params.prompt_logprobs is not None:
        raise InvalidRequest(
            "prompt_logprobs",
            "prompt_logprobs: an encoder-decoder model's prompt is its encoder input, which it "
            "does not predict; leave prompt_logprobs unset",
        )
