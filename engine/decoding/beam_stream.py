"""What a beam-search request shows: `BeamStream.outputs(request, search)` -> its n
`CompletionOutput`s (indices 0..n-1), the deltas since the previous call (see outputs.py).

- While the search runs, every index shows the same agreed prefix: the generated tokens on
  which every live beam and every kept hypothesis agree. The best hypothesis at the end is one
  of the kept ones or descends from a live beam, so it starts with that prefix; the prefix only
  grows (kept hypotheses leave, new ones descend from live beams), so the stream is append-only.
  Its text comes from one incremental detokenizer fed the agreed tokens (never a stop token:
  a live beam holds none, having gone on past every position of the prefix).
- Once the search is done, index i is the i-th best hypothesis whole, from offset 0: text decoded by the same
  rules as a sampled sequence (stop token hidden unless include_stop_str_in_output), raw
  cumulative log-prob, finish and stop reasons. Its text starts with everything streamed.
- Aborted or failed before the end: the agreed prefix, with the request's finish reason.
"""

from __future__ import annotations

from engine.decoding.beam_search import BeamSearch, Hypothesis
from engine.decoding.detokenizer import IncrementalDetokenizer
from engine.decoding.stop_checker import StopCriteria, finish_after_token
from engine.requests.outputs import CompletionOutput
from engine.requests.request import Request, TokenSequence
from engine.requests.sampling_params import SamplingParams
from engine.types import TokenLogprob


class BeamStream:
    def __init__(
        self,
        params: SamplingParams,
        criteria: StopCriteria,
        tokenizer,
        *,
        without_context: bool = False,
    ) -> None:
        self.params = params
        self.criteria = criteria
        self._tokenizer = tokenizer
        self._without_context = without_context  # see IncrementalDetokenizer.from_params
        self._agreed: list[int] = []
        self._agreed_logprobs: list[TokenLogprob] = []
        self._detok = self._new_detokenizer() if tokenizer else None
        self._final: tuple[CompletionOutput, ...] | None = None
        self._sent_tokens = 0  # agreed tokens already reported
        self._sent_chars = 0

    def outputs(self, request: Request, search: BeamSearch) -> tuple[CompletionOutput, ...]:
        if search.done:
            if self._final is None:
                best = search.hypotheses[: self.params.n]
                self._final = tuple(self._whole(i, h) for i, h in enumerate(best))
            return self._final
        reason = next((s.finish_reason for s in request.seqs if s.is_finished), None)
        if request.is_finished:
            reason = reason or "abort"
            if self._detok is not None and not self._detok.finished:
                self._detok.finish()  # release a held-back partial character
        elif request.live_seqs:
            self._extend(request.live_seqs, search.hypotheses)
        sent = self._sent_tokens
        text = self._detok.take_new_text() if self._detok is not None else ""
        new_ids = tuple(self._agreed[sent:])
        logprobs = tuple(self._agreed_logprobs[sent:]) if self.params.logprobs is not None else None
        outputs = tuple(
            CompletionOutput(
                index=i,
                text=text,
                token_ids=new_ids,
                cumulative_logprob=None,  # known per hypothesis only
                logprobs=logprobs,
                finish_reason=reason,
                text_offset=self._sent_chars,
                token_offset=sent,
            )
            for i in range(self.params.n)
        )
        self._sent_tokens, self._sent_chars = len(self._agreed), self._sent_chars + len(text)
        return outputs

    def _extend(self, beams: list[TokenSequence], hypotheses: list[Hypothesis]) -> None:
        """Grows the agreed prefix to the longest common one (beams hold prompt + output)."""
        members = [(s.token_ids, s.num_prompt_tokens) for s in beams]
        members += [(h.token_ids, 0) for h in hypotheses]
        end = min(len(tokens) - offset for tokens, offset in members)
        first, first_offset = members[0]
        n = len(self._agreed)
        while n < end and all(t[off + n] == first[first_offset + n] for t, off in members):
            token = first[first_offset + n]
            self._agreed.append(token)
            if self.params.logprobs is not None:
                self._agreed_logprobs.append(beams[0].logprobs[n])
            if self._detok is not None:
                self._detok.add(token)
            n += 1

    def _new_detokenizer(self) -> IncrementalDetokenizer:
        return IncrementalDetokenizer.from_params(
            self._tokenizer, self.params, without_context=self._without_context
        )

    def _whole(self, index: int, hyp: Hypothesis) -> CompletionOutput:
        text = ""
        if self._tokenizer is not None:
            detok = self._new_detokenizer()
            for k, token in enumerate(hyp.token_ids, start=1):
                finish_after_token(self.criteria, detok, token, k)
            text = detok.finish()
        return CompletionOutput(
            index=index,
            text=text,
            token_ids=hyp.token_ids,
            cumulative_logprob=hyp.cumulative_logprob,
            logprobs=hyp.logprobs if self.params.logprobs is not None else None,
            finish_reason=hyp.finish_reason,
            stop_reason=hyp.stop_reason,
        )
