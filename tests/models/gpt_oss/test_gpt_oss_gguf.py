"""gpt-oss from a GGUF file as llama.cpp's converter writes it (bench/gpt_oss_gguf.py) equals
transformers on the folder it was written from. transformers' own GGUF loader cannot be the
oracle here (it leaves the gpt-oss experts, their biases and the sinks unloaded), so the oracle
is transformers' GptOssForCausalLM on the same tiny checkpoint's folder: float32 and BF16
matrices (the folder rounded to bfloat16 first, so both sides hold the same values), and MXFP4
experts written as stored (both sides dequantise the same bits; gguf's own MXFP4 dequantiser
checks the written blocks). The checkpoint's expert biases are large enough that llama.cpp's
SwiGLU clamp of 7 (no GGUF key holds it) bites. Then the engine's greedy tokens from the GGUF
equal transformers' generate on the folder, and a GGUF missing a gpt-oss tensor is refused
naming it."""

from __future__ import annotations

import pytest
import torch
from gguf import GGMLQuantizationType
from gguf.quants import dequantize
from safetensors.torch import load_file, save_file

from bench.gpt_oss_gguf import write_gpt_oss_gguf
from models.gguf.file import GGUFFile, open_gguf
from models.gpt_oss.gguf import gpt_oss_config
from models.loader import load_model
from tests.engine.engine_fixtures import random_prompts, tiny_engine
from tests.models.gpt_oss.checkpoint import gguf_checkpoint, save_mxfp4_folder
from tests.models.moe.test_moe_engine import assert_greedy_equals_generate
from tests.models.moe.test_moe_vs_transformers import run_prefill_then_decode
from tests.models.test_models_vs_transformers import hf_logits


def assert_logits_equal(ours, hf) -> None:
    for got, want in run_prefill_then_decode(ours, lambda t: hf_logits(hf, t), 4):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


@pytest.mark.parametrize(
    ("float_type", "fuse"),
    [("F32", False), ("BF16", False), ("F16", False), ("Q8_0", False), ("F32", True)],
)
def test_gguf_logits_equal_transformers_on_the_folder(float_type, fuse, tmp_path) -> None:
    """`fuse`: gate and up as one ffn_gate_up_exps, as llama.cpp's --fuse-gate-up-exps writes."""
    hf = gguf_checkpoint(float_type)
    hf.save_pretrained(tmp_path / "folder")
    path = write_gpt_oss_gguf(tmp_path / "folder", tmp_path / "m.gguf", float_type, fuse)
    gguf = open_gguf(path)
    assert gguf.architecture == "gpt-oss"
    ours, config = load_model(path, "float32", "cpu", use_cache=False)
    assert config.layer_windows == (8, None) and config.moe.swiglu_limit == 7.0
    assert config.rope_scaling["rope_type"] == "yarn" and not config.rope_scaling["truncate"]
    assert_logits_equal(ours, hf)


@pytest.mark.parametrize(("fuse", "rest"), [(False, "F32"), (True, "F32"), (False, "Q8_0")])
def test_mxfp4_experts_as_stored_equal_transformers_on_the_mxfp4_folder(
    fuse, rest, tmp_path
) -> None:
    """`rest`: the other matrices' type (Q8_0: as llama-quantize'd gpt-oss files hold them)."""
    hf = gguf_checkpoint(rest)
    folder = save_mxfp4_folder(hf, tmp_path / "folder", torch.Generator().manual_seed(5))
    path = write_gpt_oss_gguf(folder, tmp_path / "m.gguf", rest, fuse_gate_up=fuse)
    gguf = open_gguf(path)
    gate = gguf.info(f"blk.1.ffn_gate{'_up' if fuse else ''}_exps.weight")
    assert gate.type_id == GGMLQuantizationType.MXFP4
    # gguf-py's MXFP4 dequantiser reads the written blocks as the dense gate rows (even rows)
    values = torch.from_numpy(dequantize(gguf.blocks(gate).numpy(), GGMLQuantizationType.MXFP4))
    want = hf.model.layers[1].mlp.experts.gate_up_proj.detach().transpose(1, 2)[:, 0::2]
    assert torch.equal(values[:, : want.shape[1]], want)
    # cached as the folder stores them (blocks), then read back: the same logits
    ours, _ = load_model(path, "float32", "cpu", cache_dir=tmp_path / "cache")
    assert_logits_equal(ours, hf)
    again, _ = load_model(path, "float32", "cpu", cache_dir=tmp_path / "cache")
    assert_logits_equal(again, hf)


def test_engine_greedy_from_the_gguf_equals_generate_on_the_folder(tmp_path, monkeypatch) -> None:
    hf = gguf_checkpoint()
    hf.save_pretrained(tmp_path / "folder")
    path = write_gpt_oss_gguf(tmp_path / "folder", tmp_path / "m.gguf")
    monkeypatch.setenv("TGSERVE_CACHE_DIR", str(tmp_path / "cache"))
    engine = tiny_engine(path, max_num_batched_tokens=32)
    assert_greedy_equals_generate(engine, hf, random_prompts(3, (3, 30), seed=1), 10)


def test_a_gguf_missing_a_gpt_oss_tensor_is_refused_naming_it(tmp_path) -> None:
    folder = tmp_path / "folder"
    gguf_checkpoint().save_pretrained(folder)
    tensors = load_file(folder / "model.safetensors")
    del tensors["model.layers.1.self_attn.sinks"]
    save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
    path = write_gpt_oss_gguf(folder, tmp_path / "m.gguf")
    with pytest.raises(ValueError, match="'blk.1.attn_sinks.weight'"):
        load_model(path, "float32", "cpu", use_cache=False)


def test_yarn_keys_whose_meaning_is_not_transformers_are_refused_by_name(tmp_path) -> None:
    meta = {"gpt-oss.rope.scaling.type": "yarn", "gpt-oss.rope.scaling.factor": 32.0,
            "gpt-oss.rope.scaling.original_context_length": 4096,
            "gpt-oss.rope.scaling.yarn_attn_factor": 1.5}  # fmt: skip
    with pytest.raises(ValueError, match="gpt-oss.rope.scaling.yarn_attn_factor"):
        gpt_oss_config(GGUFFile(tmp_path / "m.gguf", meta, {}, ()), fake_keys(meta))
    del meta["gpt-oss.rope.scaling.yarn_attn_factor"]
    scaling = gpt_oss_config(GGUFFile(tmp_path / "m.gguf", meta, {}, ()), fake_keys(meta))
    assert scaling["rope_scaling"] == {"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0,
        "beta_slow": 1.0, "truncate": False, "original_max_position_embeddings": 4096}  # fmt: skip


def fake_keys(meta: dict):
    """models/gguf/config.py's key reader over `meta`, with the few keys a config needs."""
    meta |= {"gpt-oss.block_count": 2, "gpt-oss.expert_count": 4, "gpt-oss.expert_used_count": 2,
             "gpt-oss.expert_feed_forward_length": 32}  # fmt: skip

    def key(name: str, default=None, *, required: bool = False):
        return meta.get(f"gpt-oss.{name}", default)

    return key
