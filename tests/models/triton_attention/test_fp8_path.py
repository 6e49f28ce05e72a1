"""The Triton forward path (models/forward_path.py `TritonPath`) over an fp8 K/V cache
(`--kv-cache-dtype fp8`, models/kv_fp8.py), on the tiny Mistral (GQA 3, window 8) through
Triton's interpreter:
- layer 0's K/V come from the embeddings alone, so its fp8 cache holds, byte for byte, the
  writer's rows of what the float cache holds (unwritten slots: zero rows both ways);
- a sequence's greedy tokens and logits are the same alone or decoded beside others (batch
  invariance survives the fp8 cache: each row's scale is its own);
- a forward path that cannot read fp8 rows (the PyTorch ones) refuses the cache, naming the flag.
Greedy agreement with the float cache is not asserted (no bound the arithmetic gives)."""

from __future__ import annotations

import pytest
import torch

from models.forward_path import TritonPath, select_forward_path
from models.kv_fp8 import quantize_fp8_rows
from models.linear_backend import use_invariant_linears
from tests.checkpoints import make_hf_model
from tests.models.paged_driver import PagedDriver
from tests.models.test_fused_decoder import ours_from

PROMPTS = [[5, 17, 99, 3, 250, 41, 8, 77, 13, 60, 2, 31], [7, 7, 120], [64, 9, 200, 5, 33]]
NEW_TOKENS = 3


@pytest.fixture(scope="module")
def model():
    model = ours_from(make_hf_model("mistral"), torch.float32)
    use_invariant_linears(model)  # rows that do not depend on the batch, as the CPU paths run
    return model


def _greedy(model, prompts, kv_cache_dtype: str) -> tuple[PagedDriver, list, list]:
    """Prefill `prompts` in one step, then NEW_TOKENS - 1 batched greedy decode steps, through
    the one-pass kernel (the batch-invariant one, as under --batch-invariant)."""
    driver = PagedDriver(model, block_size=4, kv_cache_dtype=kv_cache_dtype)
    path = TritonPath(model, driver.kv, split_decode=False)
    seqs = [driver.add_sequence() for _ in prompts]
    logits = driver.step(dict(zip(seqs, prompts, strict=True)), fused=path)
    rows = {s: [logits[s][-1]] for s in seqs}
    tokens = {s: [int(logits[s][-1].argmax())] for s in seqs}
    for _ in range(NEW_TOKENS - 1):
        logits = driver.step({s: tokens[s][-1:] for s in seqs}, fused=path)
        for s in seqs:
            rows[s].append(logits[s][0])
            tokens[s].append(int(logits[s][0].argmax()))
    return driver, [tokens[s] for s in seqs], [torch.stack(rows[s]) for s in seqs]


def test_layer_0_holds_the_writers_rows_of_the_float_cache(cpu_triton, model) -> None:
    fp8 = PagedDriver(model, block_size=4, kv_cache_dtype="fp8")
    ref = PagedDriver(model, block_size=4)  # the same seed: the same block tables
    for driver in (fp8, ref):
        seqs = [driver.add_sequence() for _ in PROMPTS]
        driver.step(dict(zip(seqs, PROMPTS, strict=True)), fused=TritonPath(model, driver.kv))
    for got, want in zip(fp8.kv[0], ref.kv[0], strict=True):
        assert got.dtype == torch.uint8 and got.shape[-1] == want.shape[-1] + 4
        assert torch.equal(got, quantize_fp8_rows(want))


def test_a_sequences_tokens_are_the_same_alone_or_batched(cpu_triton, model) -> None:
    _, batched_tokens, batched_logits = _greedy(model, PROMPTS, "fp8")
    _, alone_tokens, alone_logits = _greedy(model, PROMPTS[:1], "fp8")
    assert alone_tokens[0] == batched_tokens[0]
    assert torch.equal(alone_logits[0], batched_logits[0])


def test_paths_that_cannot_read_fp8_rows_refuse_them(model) -> None:
    driver = PagedDriver(model, block_size=4, kv_cache_dtype="fp8")
    with pytest.raises(ValueError, match="fp8 is read only by tgserve's Triton paged attention"):
        select_forward_path(model, driver.kv, torch.device("cpu"), cpu_kernels=False)
