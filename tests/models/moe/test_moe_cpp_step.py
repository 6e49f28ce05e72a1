"""Mixture-of-experts layers inside the C++ step (models/cpu_kernels/moe_block.h, moe_layer.py):
every step's router, top-k, experts and weighted sum in the same C++ call as the attention.
Oracles: transformers' logits on tiny random checkpoints (float32, 1e-4: Mixtral, Qwen3-MoE
with a dense layer, Qwen2-MoE's shared expert and qkv bias), transformers' GGUF loader on the
same Q8_0 file (experts as stored, through the block kernels), and the row's own solo run (a
row alone equals it among rows sharing its experts, bit for bit); with int8 activations, the
eager block over the same Q8 panels."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType as QT

from models.activation_quant import Q8Linear, quantize_activations_int8
from models.cpu_kernels.fused_decoder import FusedDecoder
from models.loader import load_model
from models.moe.stored_experts import BlockExperts
from tests.checkpoints import MOE_ARCHITECTURES, VOCAB, make_hf_model
from tests.models.moe.moe_gguf import write_moe_gguf
from tests.models.moe.test_moe_vs_transformers import ours_from
from tests.models.paged_driver import PagedDriver
from tests.models.test_fused_decoder import prompts
from tests.models.test_models_vs_transformers import hf_logits

pytestmark = pytest.mark.cpu_kernels  # skipped off the CPU (tests/conftest.py)


def fused_steps(model, reference, decode_steps: int = 4):
    """A batched prefill of three prompts, then batched greedy decodes, every step through the
    C++ step; asserts each row's logits equal `reference(tokens)`'s (1e-4)."""
    driver = PagedDriver(model, block_size=4)
    fused = FusedDecoder.build(model, driver.kv)
    assert fused is not None
    tokens = prompts((5, 11, 18))
    seqs = [driver.add_sequence() for _ in tokens]
    logits = driver.step(dict(zip(seqs, tokens, strict=True)), fused=fused)
    for s in seqs:
        torch.testing.assert_close(logits[s], reference(tokens[s]), atol=1e-4, rtol=0)
    for _ in range(decode_steps):
        nxt = {s: [int(logits[s][-1].argmax())] for s in seqs}
        logits = driver.step(nxt, fused=fused)
        for s in seqs:
            tokens[s] += nxt[s]
            torch.testing.assert_close(logits[s][-1], reference(tokens[s])[-1], atol=1e-4, rtol=0)


@pytest.mark.parametrize("arch", MOE_ARCHITECTURES)
def test_cpp_step_equals_transformers(arch: str) -> None:
    hf = make_hf_model(arch)
    fused_steps(ours_from(hf, torch.float32, "cpu", from_files=False), lambda t: hf_logits(hf, t))


def test_cpp_step_on_experts_as_stored_equals_transformers_gguf_loading(tmp_path) -> None:
    import transformers

    hf = make_hf_model("qwen3_moe", mlp_only_layers=[])  # llama.cpp's qwen3moe: every layer sparse
    path = write_moe_gguf(hf, tmp_path / "tiny.gguf", "qwen3moe", QT.Q8_0)
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        tmp_path, gguf_file=path.name, config=hf.config
    ).eval()
    ours, _ = load_model(path, "float32", "cpu", use_cache=False)
    assert all(type(layer.mlp.experts) is BlockExperts for layer in ours.model.layers)
    fused_steps(ours, lambda t: hf_logits(theirs, t), decode_steps=2)


def test_a_row_alone_equals_it_among_rows_sharing_its_experts(tmp_path) -> None:
    """Sequence 0 alone, and beside two others (8 experts, top-4: every expert of its rows is
    shared): prefill then decodes, its logits bit for bit, float32 dense experts, Q8_0
    experts as stored (the batch's prefill rows take the block kernels' many-rows pass) and
    with int8 activations (the decodes: moe_experts.h's one region)."""
    hf = make_hf_model("qwen3_moe", mlp_only_layers=[])
    stored, _ = load_model(
        write_moe_gguf(hf, tmp_path / "tiny.gguf", "qwen3moe", QT.Q8_0), "float32", "cpu",
        use_cache=False,
    )  # fmt: skip
    int8, _ = load_model(tmp_path / "tiny.gguf", "float32", "cpu", use_cache=False)
    quantize_activations_int8(int8)
    for model in (ours_from(hf, torch.float32, "cpu", from_files=False), stored, int8):
        alone, busy = PagedDriver(model, block_size=4), PagedDriver(model, block_size=4)
        fused_alone, fused_busy = (
            FusedDecoder.build(model, alone.kv),
            FusedDecoder.build(model, busy.kv),
        )
        assert fused_alone is not None and fused_busy is not None
        tokens = prompts((9, 14, 20), seed=4)
        alone.add_sequence()
        for _ in tokens:
            busy.add_sequence()
        want = alone.step({0: tokens[0]}, fused=fused_alone)[0]
        got = busy.step(dict(enumerate(tokens)), fused=fused_busy)[0]
        assert torch.equal(got, want)
        gen = torch.Generator().manual_seed(7)
        for _ in range(3):
            nxt = torch.randint(3, VOCAB, (3,), generator=gen).tolist()
            want = alone.step({0: nxt[:1]}, fused=fused_alone)[0]
            got = busy.step({s: [t] for s, t in enumerate(nxt)}, fused=fused_busy)[0]
            assert torch.equal(got, want)


def test_a_decode_row_equals_the_same_token_at_the_end_of_a_long_prefill(tmp_path) -> None:
    """A decode step's block runs in one team (moe_experts.h: at most 8 rows per expert; the
    intermediate 160 cut into slices of 64, 64 and 32 columns for SiLU x up), a 24-token
    prefill's experts through each expert's own products (12 rows per expert on average): the
    last token's logits, bit for bit, Q8_0 experts as stored and with int8 activations."""
    hf = make_hf_model("qwen3_moe", mlp_only_layers=[], moe_intermediate_size=160)
    path = write_moe_gguf(hf, tmp_path / "tiny.gguf", "qwen3moe", QT.Q8_0)
    tokens = prompts((24,), seed=5)[0]
    for int8 in (False, True):
        model, _ = load_model(path, "float32", "cpu", use_cache=False)
        if int8:
            quantize_activations_int8(model)
        whole, split = PagedDriver(model, block_size=4), PagedDriver(model, block_size=4)
        fused_whole, fused_split = (
            FusedDecoder.build(model, whole.kv),
            FusedDecoder.build(model, split.kv),
        )
        whole.add_sequence(), split.add_sequence()
        want = whole.step({0: tokens}, fused=fused_whole)[0][-1]
        split.step({0: tokens[:-1]}, fused=fused_split)
        got = split.step({0: tokens[-1:]}, fused=fused_split)[0][-1]
        assert torch.equal(got, want), f"int8 activations: {int8}"


def test_the_one_region_equals_each_experts_products_in_turn(tmp_path) -> None:
    """A 9-row prefill (the router's product before the team) and three rows' decode steps
    with the block in one team (moe_experts.h; at decode inside the layers' one region,
    step_region.h, the router's panels split over the threads) and with its switch off (the
    router, then each expert's products in turn, as a long prefill runs them): the same logits
    bit for bit, Q8_0 experts as stored (float32, bfloat16) and with int8 activations (24
    experts: router panels of 16 and 8, one a thread at two threads; top-4: experts with 1-3
    rows at decode; the intermediate 160 in SiLU slices of 64, 64 and 32)."""
    hf = make_hf_model("qwen3_moe", mlp_only_layers=[], moe_intermediate_size=160, num_experts=24)
    path = write_moe_gguf(hf, tmp_path / "tiny.gguf", "qwen3moe", QT.Q8_0)
    tokens = prompts((2, 3, 4), seed=8)
    for dtype, int8 in (("float32", False), ("float32", True), ("bfloat16", False)):
        model, _ = load_model(path, dtype, "cpu", use_cache=False)
        if int8:
            quantize_activations_int8(model)
        driver = PagedDriver(model, block_size=4)
        fused = FusedDecoder.build(model, driver.kv)
        assert fused.moe_blocks and all(moe.panel_experts for moe in fused.moe_blocks)
        assert fused.runs_one_region
        for _ in tokens:
            driver.add_sequence()
        batch = dict(enumerate(tokens))
        want = _step_with(fused, driver, batch, one_region=False)
        logits = _step_with(fused, driver, batch, one_region=True, append=True)
        for s in batch:
            assert torch.equal(logits[s], want[s]), f"prefill, {dtype}, int8 activations: {int8}"
        for _ in range(3):
            nxt = {s: [int(logits[s][-1].argmax())] for s in logits}
            want = _step_with(fused, driver, nxt, one_region=False)
            logits = _step_with(fused, driver, nxt, one_region=True, append=True)
            for s in nxt:
                assert torch.equal(logits[s], want[s]), f"{dtype}, int8 activations: {int8}"


def _step_with(fused, driver, nxt: dict, one_region: bool, append: bool = False) -> dict:
    """One decode step of `nxt` with the sparse blocks' one region on or off; the K/V it
    writes is kept only when `append` (else the sequences' lengths are restored)."""
    for moe in fused.moe_blocks:
        moe.one_region = one_region
    lens = list(driver.lens)
    logits = driver.step(nxt, fused=fused)
    if not append:
        driver.lens[:] = lens
    return logits


def test_bfloat16_cpp_step_matches_the_eager_path() -> None:
    """bfloat16: the C++ step rounds where the eager block rounds (router logits, SiLU, each
    expert's output) and sums the ranks in float32 alike: logits agree to bf16 rounding."""
    ours = ours_from(make_hf_model("qwen2_moe"), torch.bfloat16, "cpu", from_files=False)
    want, got = _eager_and_cpp_step(ours)
    for s in want:
        torch.testing.assert_close(got[s], want[s], atol=3e-2, rtol=3e-2)


def test_int8_activations_reach_the_expert_panels_in_the_cpp_step(tmp_path) -> None:
    """--activation-quantization int8 puts Q8 panels in place of the stored expert blocks
    (models/activation_quant.py); the C++ step runs them as the eager block does (1e-4)."""
    hf = make_hf_model("qwen3_moe", mlp_only_layers=[])
    path = write_moe_gguf(hf, tmp_path / "tiny.gguf", "qwen3moe", QT.Q8_0)
    ours, _ = load_model(path, "float32", "cpu", use_cache=False)
    quantize_activations_int8(ours)
    assert all(
        isinstance(block, Q8Linear) for block in ours.model.layers[0].mlp.experts.gate_up_blocks
    )
    want, got = _eager_and_cpp_step(ours)
    for s in want:
        torch.testing.assert_close(got[s], want[s], atol=1e-4, rtol=0)


def _eager_and_cpp_step(ours) -> tuple[dict, dict]:
    """One prefill of three prompts through the eager blocks and through the C++ step:
    (eager logits, C++ step logits) by sequence."""
    eager, fast = PagedDriver(ours, block_size=4), PagedDriver(ours, block_size=4)
    fused = FusedDecoder.build(ours, fast.kv)
    assert fused is not None
    batch = dict(enumerate(prompts((3, 9, 14))))
    for _ in batch:
        eager.add_sequence(), fast.add_sequence()
    return eager.step(batch), fast.step(batch, fused=fused)
