"""The transformers backend on `random:` shapes (bench/backends/hf_random.py): it runs tgserve's
own seeded random weights, so in float32 its greedy tokens equal tgserve's for the same shape
(transformers is the independent implementation; the weights are the only thing shared), and
`tgserve bench` compares the two in one command with no download."""

from __future__ import annotations

import json

import pytest
import torch

from bench.backends.hf_random import hf_named_tensors, random_transformers_model
from bench.random_models import RANDOM_SHAPES
from engine import Engine, EngineConfig, SamplingParams
from models.random_weights import random_model
from server.cli import main

TINY = RANDOM_SHAPES["tiny-llama"]


def test_fused_rows_are_split_back_into_the_checkpoint_names():
    ours, config = random_model(TINY, torch.float32, "cpu", seed=5)
    state = ours.state_dict()
    named = hf_named_tensors(state, config)
    fused = state["model.layers.1.self_attn.qkv_proj.weight"]  # q 64 rows, k and v 32 each
    assert torch.equal(named["model.layers.1.self_attn.q_proj.weight"], fused[:64])
    assert torch.equal(named["model.layers.1.self_attn.k_proj.weight"], fused[64:96])
    assert torch.equal(named["model.layers.1.self_attn.v_proj.weight"], fused[96:])
    gate_up = state["model.layers.0.mlp.gate_up_proj.weight"]
    assert torch.equal(named["model.layers.0.mlp.gate_proj.weight"], gate_up[:128])
    assert torch.equal(named["model.layers.0.mlp.up_proj.weight"], gate_up[128:])
    assert not any("qkv_proj" in n or "gate_up" in n or "inv_freq" in n for n in named)
    with pytest.raises(ValueError, match="no name map"):
        random_transformers_model({**TINY, "model_type": "gpt2"}, torch.float32, "cpu", 0)


TINY_T5 = RANDOM_SHAPES["tiny-t5"]


@pytest.mark.parametrize(
    ("shape", "cpu_kernels", "prompt_lens"),
    [
        # PyTorch layers, as on a GPU (the C++ CPU kernels are held to transformers elsewhere)
        ("tiny-llama", False, (3, 9, 17)),
        # an encoder-decoder: the prompt is the encoder's input; cross-attention on the CPU
        # kernel, as bench runs it
        ("tiny-t5", True, (3, 17, 40)),
    ],
)
def test_transformers_on_random_weights_equals_tgserve_greedy_in_float32(
    shape, cpu_kernels, prompt_lens
):
    hf_config = RANDOM_SHAPES[shape]
    seed = EngineConfig().seed  # what bench's two backends both use
    hf = random_transformers_model(hf_config, torch.float32, "cpu", seed)
    config = EngineConfig(
        dtype="float32", device="cpu", max_num_seqs=4, max_model_len=96, cpu_kernels=cpu_kernels
    )
    engine = Engine.from_random_weights(f"random:{shape}", hf_config, config)
    gen = torch.Generator().manual_seed(3)
    prompts = [torch.randint(2, 512, (n,), generator=gen).tolist() for n in prompt_lens]
    outs = engine.generate(prompts, SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True))
    for prompt, out in zip(prompts, outs, strict=True):
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            ref = hf.generate(
                ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=10,
                min_new_tokens=10,
                do_sample=False,
                pad_token_id=0,
            )
        # the new tokens end the output (after the prompt, or the decoder's start token)
        assert list(out.outputs[0].token_ids) == ref[0, -10:].tolist()


def test_bench_compares_tgserve_and_transformers_on_a_random_shape(capsys):
    argv = "bench throughput --model random:tiny-llama --device cpu --dtype float32 "
    argv += "--num-requests 3 --input-len 6 --output-len 4 --hf-batch-size 3 "
    argv += "--backend tgserve --backend transformers --disable-cpu-kernels --skip-limits --json"
    assert main(argv.split()) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert [r["backend"] for r in lines] == ["tgserve", "transformers"]
    for r in lines:
        assert r["model"] == "tiny-llama (random weights)" and r["output_tokens"] == 12
    assert "generate()" in lines[1]["note"]


def test_bench_compares_tgserve_and_transformers_on_a_random_encoder_decoder(capsys):
    argv = "bench throughput --model random:tiny-t5 --device cpu --dtype float32 "
    argv += "--num-requests 3 --input-len 40 --output-len 5 --hf-batch-size 3 "
    argv += "--backend tgserve --backend transformers --skip-limits --json"
    assert main(argv.split()) == 0
    lines = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert [r["backend"] for r in lines] == ["tgserve", "transformers"]
    for r in lines:
        assert r["model"] == "tiny-t5 (random weights)"
        assert r["prompt_tokens"] == 120 and r["output_tokens"] == 15
    tg, hf = lines
    assert "generate()" in hf["note"]
    assert hf["output_ratio_vs_first"] == pytest.approx(hf["output_tok_s"] / tg["output_tok_s"])
