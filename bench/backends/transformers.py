"""transformers `generate` as a benchmark backend: the baseline a user gets without a server.

Contract (see bench.backends): the model is `AutoModelForCausalLM.from_pretrained(hf_folder)` (an
encoder-decoder's, T5 or BART: `AutoModelForSeq2SeqLM`, the prompt is the encoder's input) in the
bench dtype (for a GGUF, the converted copy in tgserve's cache: the same tensors; for a `random:`
shape, tgserve's own seeded random weights: hf_random.py), on the device tgserve runs on
(`options.device`, resolved as the engine resolves it). Greedy, with
`min_new_tokens = max_new_tokens` so EOS never ends a row early and every backend decodes the same
counts. Latency: one request, batch 1; a streamer timestamps the first generated token (generate
hands it the prompt first, then each new token). Throughput: static batches of `hf_batch_size`
requests in workload order, left-padded with a pad token (an encoder's input: right-padded, so
learned absolute positions stay those of the unpadded input); a batch decodes as many tokens as its
longest request asks for (the rows that asked for fewer waste the rest: that is static
batching), and only the asked-for tokens count as output.
"""

from __future__ import annotations

import gc
import time
from collections.abc import Callable, Sequence

from bench.backends import (
    BackendOptions,
    BackendUnavailable,
    LatencySample,
    ThroughputSample,
    count_tokens,
)
from bench.model_source import ModelSource
from bench.workload import BenchRequest


class _FirstTokenClock:
    """A generate() streamer: put #1 is the prompt, put #2 the first new token (the device is
    synchronized first: on a GPU the token is only queued when generate hands it over)."""

    def __init__(self, synchronize: Callable[[], None]) -> None:
        self.puts = 0
        self.first_token_at: float | None = None
        self.synchronize = synchronize

    def put(self, value) -> None:
        self.puts += 1
        if self.puts == 2:
            self.synchronize()
            self.first_token_at = time.perf_counter()

    def end(self) -> None:
        pass


class TransformersBackend:
    name = "transformers"

    def __init__(self, model, batch_size: int, device: str = "cpu") -> None:
        import torch

        self.model = model
        self.batch_size = batch_size
        self.torch = torch
        self.device = torch.device(device)
        config = model.config
        eos = (
            config.eos_token_id
            if isinstance(config.eos_token_id, int)
            else (config.eos_token_id or [0])[0]
        )
        self.pad_id = config.pad_token_id if config.pad_token_id is not None else eos
        # generate() returns the decoder's tokens alone: its start token, then the new ones
        self.encoder_decoder = bool(getattr(config, "is_encoder_decoder", False))
        self.note = f"generate(), {config._attn_implementation} attention" + (
            f", static batches of {batch_size}" if batch_size > 1 else ""
        )
        if self.device.type != "cpu":
            self.note += f", {self.device}"

    def _synchronize(self) -> None:
        if self.device.type == "cuda":
            self.torch.cuda.synchronize(self.device)

    def _generate(self, ids, mask, new_tokens: int, streamer=None):
        return self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=new_tokens,
            min_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=self.pad_id,
            streamer=streamer,
        )

    def run_latency(self, request: BenchRequest) -> LatencySample:
        torch = self.torch
        ids = torch.tensor([request.prompt_token_ids], device=self.device)
        clock = _FirstTokenClock(self._synchronize)
        with torch.inference_mode():
            self._synchronize()
            start = time.perf_counter()
            out = self._generate(ids, torch.ones_like(ids), request.output_len, clock)
            self._synchronize()
            end = time.perf_counter()
        generated = out.shape[1] - self._output_prefix(ids.shape[1])
        first = clock.first_token_at if clock.first_token_at is not None else end
        return LatencySample(ids.shape[1], generated, first - start, end - first)

    def _output_prefix(self, prompt_width: int) -> int:
        """Columns of generate()'s output before the new tokens."""
        return 1 if self.encoder_decoder else prompt_width

    def run_throughput(
        self, requests: Sequence[BenchRequest], on_finished: Callable[[int], None]
    ) -> ThroughputSample:
        torch = self.torch
        start = time.perf_counter()
        done = 0
        for i in range(0, len(requests), self.batch_size):
            batch = requests[i : i + self.batch_size]
            width = max(len(r.prompt_token_ids) for r in batch)
            ids = torch.full((len(batch), width), self.pad_id, dtype=torch.long)
            mask = torch.zeros((len(batch), width), dtype=torch.long)
            for row, r in enumerate(batch):
                n = len(r.prompt_token_ids)
                # left padding: every prompt ends at the last column (an encoder's: right)
                cols = slice(0, n) if self.encoder_decoder else slice(width - n, width)
                ids[row, cols] = torch.tensor(r.prompt_token_ids)
                mask[row, cols] = 1
            new_tokens = max(r.output_len for r in batch)
            with torch.inference_mode():
                out = self._generate(ids.to(self.device), mask.to(self.device), new_tokens)
            decoded = out.shape[1] - self._output_prefix(width)
            if decoded != new_tokens:
                raise RuntimeError(
                    f"transformers decoded {decoded} tokens, {new_tokens} were asked for"
                )
            done += len(batch)
            on_finished(done)
        self._synchronize()
        elapsed = time.perf_counter() - start
        prompt_tokens, output_tokens = count_tokens(requests)
        return ThroughputSample(len(requests), prompt_tokens, output_tokens, elapsed)

    def close(self) -> None:
        self.model = None
        gc.collect()


def load(source: ModelSource, options: BackendOptions) -> TransformersBackend:
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoModelForSeq2SeqLM
    except ImportError as exc:
        raise BackendUnavailable(
            f"the transformers backend needs transformers ({exc}); install it with "
            "`pip install transformers accelerate` (a test extra of tgserve, never a runtime dependency)"
        ) from exc
    from engine import EngineConfig, resolve_device

    device = resolve_device(options.device, torch.cuda.is_available())
    dtype = getattr(torch, options.dtype)
    if source.random_weights is not None:
        from bench.backends.hf_random import random_transformers_model

        seed = EngineConfig().seed  # the seed tgserve's backend builds the same shape with
        model = random_transformers_model(source.random_weights, dtype, device, seed)
    elif source.hf_folder is None:
        raise BackendUnavailable(f"the transformers backend loads model folders, not {source.path}")
    else:
        auto_class = (
            AutoModelForSeq2SeqLM if source.config.encoder_decoder else AutoModelForCausalLM
        )
        model = auto_class.from_pretrained(source.hf_folder, dtype=dtype).to(device)
    return TransformersBackend(model.eval(), options.hf_batch_size, device)
