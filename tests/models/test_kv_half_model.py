"""A float32 model's steps over a float16 K/V cache (`--kv-cache-dtype float16`,
models/kv_half.py), on tiny transformers checkpoints:

- the C++ step (Llama, Qwen2) and the PyTorch layers with the C++ attention (GPT-2: the path of
  models the C++ step does not run) give the logits of the PyTorch reference path over a float16
  cache (the model's own layers, its rows written by `to_half_rows`, read by the key-block
  attention in float32), to float32 tolerance, while the float32 cache's logits differ from
  those by more: each path computes "float32 attention over the rounded rows";
- the C++ step's append stores `to_half_rows` of the K/V it computed, bit for bit: layer 0's rows
  (which no attention precedes) are the float32 cache's rows rounded, values past 65504
  saturated (layer 0's V weights scaled up so that some are);
- a sequence gets the same logits and float16 rows alone or beside other sequences' prefill
  chunks and decodes (bit for bit)."""

from __future__ import annotations

import pytest
import torch

from models.cpu_kernels.fused_decoder import FusedDecoder
from models.forward_path import PyTorchPath
from models.kv_half import HALF_MAX, to_half_rows
from tests.checkpoints import make_hf_model
from tests.models import test_cpu_kernel_invariance as invariance
from tests.models.paged_driver import PagedDriver
from tests.models.test_fused_decoder import ours_from, prompts
from tests.models.test_kv_int8_model import int8_path, run_steps

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)


@pytest.mark.parametrize("arch,path", [("llama", "step"), ("qwen2", "step"), ("gpt2", "layers")])
def test_float16_logits_equal_the_reference_over_float16_rows(arch, path) -> None:
    ours = ours_from(make_hf_model(arch), torch.float32)
    tokens = prompts((9, 21, 14), seed=2)
    logits = {}
    for name, kind in (("kernel", "float16"), ("reference", "float16"), ("float32", "auto")):
        driver = PagedDriver(ours, kv_cache_dtype=kind)
        run = PyTorchPath(ours, driver.kv, attention_kernel=False)  # key-block attention
        if name != "reference":
            run = int8_path(ours, driver, path)  # the C++ step, or PyTorch layers + C++ attention
            assert run is not None, "the C++ step serves this model"
        logits[name] = run_steps(driver, run, tokens)
    err = float((logits["kernel"] - logits["reference"]).abs().max())
    moved = float((logits["float32"] - logits["reference"]).abs().max())
    assert err <= 2e-5, err
    assert moved >= 10 * err, (moved, err)  # the rounding is seen, and reproduced


def test_the_cpp_append_stores_the_rounded_rows_saturated() -> None:
    ours = ours_from(make_hf_model("llama"), torch.float32)
    attn = ours.model.layers[0].self_attn
    q, kv = attn.num_heads * attn.head_dim, attn.num_kv_heads * attn.head_dim
    with torch.no_grad():
        attn.qkv_proj.weight[q + kv :] *= 3e5  # layer 0's V rows: some values past 65504
    tokens = prompts((23, 6), seed=3)
    rows = {}
    for kind in ("auto", "float16"):
        driver = PagedDriver(ours, kv_cache_dtype=kind)
        fused = FusedDecoder.build(ours, driver.kv)
        seqs = [driver.add_sequence() for _ in tokens]
        driver.step(dict(zip(seqs, tokens, strict=True)), fused=fused)
        driver.step({s: [5] for s in seqs}, fused=fused)  # and a decode step's append
        slots = torch.cat([invariance._slots(driver, s) for s in seqs])
        k_cache, v_cache = driver.kv[0]
        rows[kind] = (k_cache.flatten(0, 1)[slots], v_cache.flatten(0, 1)[slots])
    (k32, v32), (k16, v16) = rows["auto"], rows["float16"]
    assert k16.dtype == torch.float16
    assert float(v32.abs().max()) > HALF_MAX > float(v32.abs().median())
    assert torch.equal(k16, to_half_rows(k32)) and torch.equal(v16, to_half_rows(v32))
    assert torch.isfinite(v16).all()


def test_the_float16_step_gives_a_sequence_the_same_bits_alone_or_batched() -> None:
    invariance.test_the_cpp_step_gives_a_sequence_the_same_bits_alone_or_batched(
        torch.float32, "qwen3", "float16"
    )
