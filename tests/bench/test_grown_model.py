"""`tgserve bench grow-model`: the grown GGUF copies its source's tensors byte for byte, adds
layers whose output projections are the seeded noise asked for, and with noise 0 computes its
source's function exactly (oracles: transformers' own GGUF loader reading both files, and
tgserve's greedy tokens and logprobs on both); with noise it is a target the source drafts for
with some proposals refused, speculation leaving its outputs unchanged."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader
from gguf.quants import dequantize

from bench.grown_model import write_grown_gguf
from engine import Engine, EngineConfig, SamplingParams, SpeculativeConfig
from server.cli import main
from tests.models.gguf.test_stored import tiny_quantised_gguf

CONFIG = dict(dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4)
PROMPTS = [list(range(5, 19)), [7, 3, 40, 41, 42, 7, 3], list(range(60, 90))]
PARAMS = SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True, logprobs=2)


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    return tiny_quantised_gguf(tmp_path_factory.mktemp("grow"), QT.Q4_1, tied=True)


def _tensors(path) -> dict:
    return {t.name: t for t in GGUFReader(path).tensors}


def _answers(path, **config) -> list:
    engine = Engine.from_model(str(path), EngineConfig(**CONFIG, **config))
    try:
        outs = engine.generate(PROMPTS, PARAMS)
        return [(o.outputs[0].token_ids, o.outputs[0].logprobs) for o in outs], engine
    finally:
        engine.close()


def test_the_grown_file_copies_its_source_and_adds_noisy_layers(source, tmp_path):
    grown = write_grown_gguf(tmp_path / "g.gguf", extra_layers=3, noise=0.05, source=source, seed=1)
    old, new = _tensors(source), _tensors(grown)
    assert int(GGUFReader(grown).fields["llama.block_count"].contents()) == 5
    # after source layer i come floor((i + 1) * 3 / 2) - floor(i * 3 / 2) new ones: 1, then 2
    where = {0: 0, 1: 2}
    for name, tensor in old.items():
        if name.startswith("blk."):
            i, part = int(name.split(".")[1]), name.split(".", 2)[2]
            name = f"blk.{where[i]}.{part}"
        assert new[name].tensor_type == tensor.tensor_type
        assert np.array_equal(new[name].data, tensor.data), name
    for index, copied_from in ((1, 0), (3, 1), (4, 1)):
        for part in ("attn_norm", "attn_q", "attn_k", "attn_v", "ffn_norm", "ffn_gate", "ffn_up"):
            ours, theirs = (
                new[f"blk.{index}.{part}.weight"],
                old[f"blk.{copied_from}.{part}.weight"],
            )
            assert np.array_equal(ours.data, theirs.data)
        for part in ("attn_output", "ffn_down"):
            tensor = new[f"blk.{index}.{part}.weight"]
            assert tensor.tensor_type == old[f"blk.0.{part}.weight"].tensor_type
            values = dequantize(tensor.data, QT(tensor.tensor_type))
            assert values.std() == pytest.approx(0.05, rel=0.2)


def test_without_noise_it_computes_its_source_exactly(source, tmp_path):
    grown = write_grown_gguf(tmp_path / "same.gguf", extra_layers=4, noise=0.0, source=source)
    ids = torch.tensor([PROMPTS[0]])
    logits = [
        transformers.AutoModelForCausalLM.from_pretrained(
            str(path.parent), gguf_file=path.name, dtype=torch.float32
        )(ids).logits
        for path in (source, grown)
    ]
    assert torch.equal(logits[0], logits[1])  # zero output projections add exact zeros
    assert _answers(grown)[0] == _answers(source)[0]


def test_with_noise_the_source_drafts_for_it_and_outputs_are_unchanged(source, tmp_path):
    grown = write_grown_gguf(tmp_path / "noisy.gguf", extra_layers=4, noise=0.3, source=source)
    plain, _ = _answers(grown)
    assert plain != _answers(source)[0]  # the noise changes what the grown model says
    spec = SpeculativeConfig(method="draft", num_tokens=3, model=str(source))
    spec_answers, engine = _answers(grown, speculative=spec)
    assert spec_answers == plain
    stats = engine.stats().speculation
    assert 0 < stats.num_accepted_tokens < stats.num_proposed_tokens


def test_the_command_writes_it(source, tmp_path, capsys):
    out = tmp_path / "cli.gguf"
    args = f"bench grow-model --out {out} --source {source} --extra-layers 2 --noise 0"
    assert main(args.split()) == 0
    assert "wrote" in capsys.readouterr().out
    assert int(GGUFReader(out).fields["llama.block_count"].contents()) == 4
    with pytest.raises(ValueError, match="noise"):
        write_grown_gguf(tmp_path / "bad.gguf", extra_layers=1, noise=-1.0, source=source)
