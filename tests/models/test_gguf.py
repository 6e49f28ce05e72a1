"""GGUF reading: tensor types against the GGML block formats, names and layouts against
transformers (tiny seeded models written as GGUF here, and the real SmolLM2 file), config mapping.

GGUF files are written in llama.cpp's convention: names from gguf-py's own HF->GGUF name map,
Q/K rows permuted as llama.cpp's converter does for "llama", GPT-2 Conv1D weights transposed.
transformers' own GGUF loader reading the same file back is the check that the writer is right.
"""

from __future__ import annotations

import os
import shutil
import struct
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType as QT

from models.attention import AttentionMetadata
from models.default_model import default_model_path
from models.gguf.file import open_gguf
from models.loader import load_checkpoint, load_model
from tests.ggml_blocks import hand_dequantise

ROWS, COLS = 4, 64  # two 32-wide blocks per row


# ---------- tensor types ----------


def _write(
    path: Path, tensors: dict[str, tuple[np.ndarray, QT | None]], arch: str = "llama"
) -> Path:
    writer = gguf.GGUFWriter(str(path), arch=arch)
    for name, (array, raw_dtype) in tensors.items():
        writer.add_tensor(name, array, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def test_every_supported_type_reads_back_to_the_ggml_block_format_values(tmp_path):
    torch.manual_seed(0)
    original = (torch.randn(ROWS, COLS) * 3).numpy()
    bf16_bits = torch.from_numpy(original).bfloat16().view(torch.int16).numpy().view(np.uint8)
    quantised = {q: gguf.quants.quantize(original, q) for q in (QT.Q8_0, QT.Q4_0, QT.Q4_1)}
    path = _write(
        tmp_path / "types.gguf",
        {
            "f32": (original, None),
            "f16": (original.astype(np.float16), None),
            "bf16": (bf16_bits.reshape(ROWS, -1), QT.BF16),
            **{q.name.lower(): (raw, q) for q, raw in quantised.items()},
        },
    )
    read = dict(open_gguf(path).tensors())
    assert torch.equal(read["f32"], torch.from_numpy(original))
    assert torch.equal(read["f16"], torch.from_numpy(original).half())
    assert torch.equal(read["bf16"], torch.from_numpy(original).bfloat16())
    amax, spread = np.abs(original).max(), original.max() - original.min()
    tolerance = {QT.Q8_0: amax / 127, QT.Q4_0: amax / 8, QT.Q4_1: spread / 15}
    for qtype, raw in quantised.items():
        got = read[qtype.name.lower()]
        assert got.dtype == torch.float32 and got.shape == (ROWS, COLS)
        assert torch.equal(got, torch.from_numpy(hand_dequantise(raw, qtype))), qtype.name
        assert np.abs(got.numpy() - original).max() <= tolerance[qtype], qtype.name


def test_hand_built_q4_blocks_put_low_nibbles_first():
    # One Q4_1 block: d = 0.5, m = -1, byte j holds (low nibble j, high nibble 15 - j).
    block = struct.pack("<ee", 0.5, -1.0) + bytes((15 - j) << 4 | j for j in range(16))
    want = [j * 0.5 - 1 for j in range(16)] + [(15 - j) * 0.5 - 1 for j in range(16)]
    raw = np.frombuffer(block, dtype=np.uint8).reshape(1, -1)
    assert gguf.quants.dequantize(raw, QT.Q4_1).ravel().tolist() == want
    block0 = struct.pack("<e", 0.25) + bytes([0x9F] * 16)  # low 15 -> +7 d, high 9 -> +1 d
    raw0 = np.frombuffer(block0, dtype=np.uint8).reshape(1, -1)
    assert gguf.quants.dequantize(raw0, QT.Q4_0).ravel().tolist() == [1.75] * 16 + [0.25] * 16


def test_unsupported_tensor_type_is_refused_naming_file_and_tensor(tmp_path):
    raw = np.zeros((2, 144), dtype=np.uint8)  # one 256-wide Q4_K block per row
    path = _write(tmp_path / "k.gguf", {"blk.0.attn_q.weight": (raw, QT.Q4_K)})
    with pytest.raises(ValueError, match=r"k\.gguf.*blk\.0\.attn_q\.weight.*Q4_K"):
        dict(open_gguf(path).tensors())


def test_header_parse_agrees_with_gguf_reader(tmp_path):
    model, meta = _tiny("qwen2", tied=False)
    meta["general.name"] = "tiny qwen"
    tokens = [f"tok{i}" for i in range(100)]  # longer than what metadata keeps, so skipped
    path = _to_gguf(model, tmp_path / "h.gguf", "qwen2", False, meta, tokens=tokens)
    ours, reader = open_gguf(path), gguf.GGUFReader(path)
    assert ours.array_lengths["tokenizer.ggml.tokens"] == len(tokens)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key == "tokenizer.ggml.tokens":
            continue
        value = field.contents()
        assert ours.metadata[key] == (value.item() if isinstance(value, np.generic) else value), key
    assert [i.name for i in ours.infos] == [t.name for t in reader.tensors]
    for info, rec in zip(ours.infos, reader.tensors, strict=True):
        assert info.type_id == rec.tensor_type and info.nbytes == rec.n_bytes
        assert torch.equal(ours.tensor(info), torch.from_numpy(np.array(rec.data))), info.name


# ---------- tiny models written as GGUF ----------


def _to_gguf(
    model: torch.nn.Module,
    path: Path,
    arch: str,
    tied: bool,
    meta: dict,
    extra: dict[str, np.ndarray] | None = None,
    tokens: list[str] | None = None,
) -> Path:
    """Writes a transformers model the way llama.cpp's convert_hf_to_gguf.py would."""
    cfg = model.config
    gguf_arch = {
        "llama": gguf.MODEL_ARCH.LLAMA,
        "qwen2": gguf.MODEL_ARCH.QWEN2,
        "gpt2": gguf.MODEL_ARCH.GPT2,
    }
    names = gguf.get_tensor_name_map(gguf_arch[arch], cfg.num_hidden_layers)
    writer = gguf.GGUFWriter(str(path), arch=arch)
    for key, value in meta.items():
        {int: writer.add_uint32, float: writer.add_float32, str: writer.add_string}[type(value)](
            key, value
        )
    if tokens is not None:
        writer.add_token_list(tokens)
    for name, array in (extra or {}).items():
        writer.add_tensor(name, array)
    for hf_name, tensor in model.state_dict().items():
        if tied and hf_name == "lm_head.weight":
            continue
        stem, suffix = hf_name.rsplit(".", 1)
        gguf_name = f"{names.get_name(stem)}.{suffix}"
        w = tensor.detach().clone()
        if arch == "llama" and gguf_name.split(".")[-2] in ("attn_q", "attn_k"):
            heads = cfg.num_attention_heads if "attn_q" in gguf_name else cfg.num_key_value_heads
            # llama.cpp: reshape(n_head, 2, rows/n_head/2, ...).swapaxes(1, 2)
            w = w.reshape(heads, 2, w.shape[0] // heads // 2, *w.shape[1:]).transpose(1, 2)
            w = w.reshape(tensor.shape)
        if arch == "gpt2" and w.dim() == 2 and gguf_name.startswith("blk."):
            w = w.t()  # Conv1D [in, out] -> [out, in]
        writer.add_tensor(gguf_name, np.ascontiguousarray(w.numpy()))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path


def _tiny(arch: str, tied: bool) -> tuple[torch.nn.Module, dict]:
    torch.manual_seed(0)
    if arch == "gpt2":
        cfg = transformers.GPT2Config(
            vocab_size=96,
            n_embd=32,
            n_layer=2,
            n_head=4,
            n_positions=1024,
            bos_token_id=0,
            eos_token_id=1,
        )
        meta = {
            "gpt2.block_count": 2,
            # transformers' GGUF reader maps context_length to n_ctx, not n_positions: keep 1024
            "gpt2.context_length": 1024,
            "gpt2.embedding_length": 32,
            "gpt2.feed_forward_length": 128,
            "gpt2.attention.head_count": 4,
            "gpt2.attention.layer_norm_epsilon": 1e-5,
            "tokenizer.ggml.bos_token_id": 0,
            "tokenizer.ggml.eos_token_id": 1,
        }
        return transformers.GPT2LMHeadModel(cfg).eval(), meta
    kwargs = dict(
        vocab_size=96, hidden_size=48, intermediate_size=80, num_hidden_layers=2,
        num_attention_heads=6, num_key_value_heads=2, rope_theta=5000.0, rms_norm_eps=1e-6,
        max_position_embeddings=128, tie_word_embeddings=tied, bos_token_id=1, eos_token_id=2,
    )  # fmt: skip
    cls = transformers.Qwen2ForCausalLM if arch == "qwen2" else transformers.LlamaForCausalLM
    config_cls = transformers.Qwen2Config if arch == "qwen2" else transformers.LlamaConfig
    model = cls(config_cls(**kwargs)).eval()
    with torch.no_grad():  # random biases, so a mix-up of bias rows would show
        for name, p in model.named_parameters():
            if name.endswith("bias"):
                p.normal_()
    meta = {
        f"{arch}.block_count": 2,
        f"{arch}.context_length": 128,
        f"{arch}.embedding_length": 48,
        f"{arch}.feed_forward_length": 80,
        f"{arch}.attention.head_count": 6,
        f"{arch}.attention.head_count_kv": 2,
        f"{arch}.rope.freq_base": 5000.0,
        f"{arch}.attention.layer_norm_rms_epsilon": 1e-6,
        f"{arch}.vocab_size": 96,
        "tokenizer.ggml.bos_token_id": 1,
        "tokenizer.ggml.eos_token_id": 2,
    }
    return model, meta


@pytest.mark.parametrize(
    ("arch", "tied"), [("llama", False), ("llama", True), ("qwen2", False), ("gpt2", True)]
)
def test_tiny_gguf_loads_to_transformers_state_dict(tmp_path, arch, tied):
    model, meta = _tiny(arch, tied)
    # GPT-2 GGUFs carry no vocab_size key (transformers then counts the token list).
    tokens = [f"t{i}" for i in range(96)] if arch == "gpt2" else None
    path = _to_gguf(model, tmp_path / f"{arch}.gguf", arch, tied, meta, tokens=tokens)
    config, tensors = load_checkpoint(path, use_cache=False)
    want = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    assert tensors.keys() == want.keys()
    for name, tensor in want.items():
        assert torch.equal(tensors[name], tensor), name
    assert config.tie_word_embeddings == tied
    assert config.architecture == type(model).__name__
    assert (config.num_layers, config.vocab_size, config.bos_token_id, config.eos_token_ids) == (
        2, 96, model.config.bos_token_id, (model.config.eos_token_id,),
    )  # fmt: skip
    if arch != "gpt2":
        assert (config.num_heads, config.num_kv_heads, config.rope_theta) == (6, 2, 5000.0)
        assert config.norm_eps == pytest.approx(1e-6) and config.attention_bias == (arch == "qwen2")
    # The writer follows llama.cpp: transformers' own GGUF loader reads it back to the same model.
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file=path.name, dtype=torch.float32
    ).state_dict()
    for name, tensor in tensors.items():
        assert torch.equal(theirs[name], tensor), name


def test_missing_vocab_size_is_taken_from_the_embedding(tmp_path):
    model, meta = _tiny("llama", tied=True)
    del meta["llama.vocab_size"]
    tokens = [f"t{i}" for i in range(90)]  # a shorter token list must not win
    path = _to_gguf(model, tmp_path / "v.gguf", "llama", True, meta, tokens=tokens)
    config, _ = load_checkpoint(path, use_cache=False)
    assert config.vocab_size == 96


def _llama3_factors(theta: float, head_dim: int, scaling: dict) -> np.ndarray:
    """What llama.cpp stores in rope_freqs.weight: plain inverse frequencies / transformers' scaled ones."""
    cfg = transformers.LlamaConfig(
        hidden_size=head_dim * 2,
        num_attention_heads=2,
        rope_theta=theta,
        rope_scaling=dict(scaling),
    )
    init = transformers.modeling_rope_utils.ROPE_INIT_FUNCTIONS["llama3"]
    scaled, _ = init(cfg, "cpu")
    plain = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    return (plain / scaled).numpy().astype(np.float32)


def test_llama3_rope_freqs_tensor_becomes_llama3_rope_scaling(tmp_path):
    scaling = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
               "original_max_position_embeddings": 8192}  # fmt: skip
    model, meta = _tiny("llama", tied=True)
    meta["llama.rope.freq_base"] = 500000.0
    good = _llama3_factors(500000.0, 8, scaling)
    for name, factors in (("good", good), ("odd", good * 1.5)):
        extra = {"rope_freqs.weight": factors}
        _to_gguf(model, tmp_path / f"{name}.gguf", "llama", True, meta, extra=extra)
    config, tensors = load_checkpoint(tmp_path / "good.gguf", use_cache=False)
    assert config.rope_scaling == scaling
    assert "rope_freqs.weight" not in tensors
    with pytest.raises(ValueError, match=r"odd\.gguf.*rope_freqs"):
        load_checkpoint(tmp_path / "odd.gguf", use_cache=False)


def test_not_a_gguf_file_is_a_clear_error(tmp_path):
    bad = tmp_path / "bad.gguf"
    bad.write_bytes(b"NOPE" + bytes(64))
    with pytest.raises(ValueError, match=r"bad\.gguf"):
        load_checkpoint(bad, use_cache=False)


def test_gguf_errors_name_the_file_and_the_tensor(tmp_path):
    model, meta = _tiny("llama", tied=True)
    wrong = meta | {"llama.feed_forward_length": 81}
    path = _to_gguf(model, tmp_path / "wrong.gguf", "llama", True, wrong)
    with pytest.raises(ValueError, match=r"wrong\.gguf \(GGUF tensor 'blk\.0\.ffn_\w+\.weight'\)"):
        load_checkpoint(path, use_cache=False)
    extra = {"blk.0.mystery.weight": np.zeros(4, dtype=np.float32)}
    path = _to_gguf(model, tmp_path / "odd.gguf", "llama", True, meta, extra=extra)
    with pytest.raises(ValueError, match=r"odd\.gguf: tensor 'blk\.0\.mystery\.weight'"):
        load_checkpoint(path, use_cache=False)
    path = _write(tmp_path / "phi.gguf", {"x": (np.zeros(4, dtype=np.float32), None)}, arch="phi3")
    with pytest.raises(ValueError, match=r"phi\.gguf: unsupported GGUF architecture 'phi3'"):
        load_checkpoint(path, use_cache=False)


# ---------- the conversion cache ----------


def _tiny_gguf(tmp_path: Path) -> Path:
    model, meta = _tiny("llama", tied=True)
    return _to_gguf(model, tmp_path / "tiny.gguf", "llama", True, meta)


def test_cached_folder_gives_the_same_tensors_without_reading_the_gguf(tmp_path, monkeypatch):
    path = _tiny_gguf(tmp_path)
    direct_config, direct = load_checkpoint(path, use_cache=False)
    first_config, first = load_checkpoint(path, cache_dir=tmp_path / "cache")
    (folder,) = (tmp_path / "cache").iterdir()
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "model.safetensors"]

    def no_gguf(_path):
        raise AssertionError("the GGUF was read although a converted folder exists")

    monkeypatch.setattr("models.loader.open_gguf", no_gguf)
    cached_config, cached = load_checkpoint(path, cache_dir=tmp_path / "cache")
    assert direct_config == first_config == cached_config
    for name, tensor in direct.items():
        assert torch.equal(first[name], tensor) and torch.equal(cached[name], tensor), name
    assert first.keys() == cached.keys() == direct.keys()


def test_cache_location_comes_from_the_environment_at_call_time(tmp_path, monkeypatch):
    path = _tiny_gguf(tmp_path)
    monkeypatch.setenv("TGSERVE_CACHE_DIR", str(tmp_path / "from-env"))
    load_checkpoint(path)
    assert [p.name.startswith("tiny-") for p in (tmp_path / "from-env").iterdir()] == [True]


def test_a_changed_gguf_is_converted_again(tmp_path):
    path = _tiny_gguf(tmp_path)
    load_checkpoint(path, cache_dir=tmp_path / "c")
    os.utime(path, ns=(1_000_000_000, 1_000_000_000))
    load_checkpoint(path, cache_dir=tmp_path / "c")
    assert len(list((tmp_path / "c").iterdir())) == 2


def test_a_damaged_cache_folder_is_converted_again(tmp_path):
    path = _tiny_gguf(tmp_path)
    _, want = load_checkpoint(path, cache_dir=tmp_path / "c")
    (folder,) = (tmp_path / "c").iterdir()
    (folder / "model.safetensors").write_bytes(b"\x08\x00")  # truncated
    with pytest.warns(UserWarning, match="damaged"):
        _, got = load_checkpoint(path, cache_dir=tmp_path / "c")
    assert all(torch.equal(got[k], v) for k, v in want.items())
    _, again = load_checkpoint(path, cache_dir=tmp_path / "c")  # repaired: no warning now
    assert again.keys() == want.keys()


def test_unwritable_cache_warns_and_still_loads(tmp_path):
    path = _tiny_gguf(tmp_path)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    with pytest.warns(UserWarning, match="could not cache"):
        _, tensors = load_checkpoint(path, cache_dir=blocker / "cache")
    assert "model.embed_tokens.weight" in tensors


# ---------- the real SmolLM2-135M-Instruct GGUF (Q4_1 + Q8_0 + F32) ----------


@pytest.fixture(scope="module")
def smollm2(tmp_path_factory):
    """(path, cache dir, transformers' own GGUF load of it, our converted tensors)."""
    path = default_model_path()
    cache = tmp_path_factory.mktemp("cache")
    theirs = transformers.AutoModelForCausalLM.from_pretrained(
        str(path.parent), gguf_file=path.name, dtype=torch.float32
    ).eval()
    config, tensors = load_checkpoint(path, cache_dir=cache)  # converts and fills the cache
    yield path, cache, theirs, config, tensors
    shutil.rmtree(cache, ignore_errors=True)  # 538 MB of float32


def test_smollm2_tensors_equal_transformers_gguf_loading(smollm2):
    _, _, theirs, config, tensors = smollm2
    want = theirs.state_dict()
    assert config.tie_word_embeddings and want["lm_head.weight"] is not None
    assert tensors.keys() == want.keys() - {"lm_head.weight"}
    for name, tensor in tensors.items():
        assert torch.equal(tensor, want[name]), name  # dequantised exactly, Q/K unpermuted
    hf = theirs.config
    assert (config.num_layers, config.hidden_size, config.num_heads, config.num_kv_heads) == (
        hf.num_hidden_layers, hf.hidden_size, hf.num_attention_heads, hf.num_key_value_heads,
    )  # fmt: skip
    assert (config.vocab_size, config.rope_theta, config.intermediate_size) == (
        hf.vocab_size, hf.rope_parameters["rope_theta"], hf.intermediate_size,
    )  # fmt: skip


def test_smollm2_logits_equal_transformers_from_the_cached_folder(smollm2):
    path, cache, theirs, _, _ = smollm2
    model, config = load_model(path, "float32", "cpu", cache_dir=cache)  # reads the cache
    torch.manual_seed(0)
    ids = torch.randint(0, config.vocab_size, (24,))
    meta = AttentionMetadata.build(
        block_tables=[[0, 1]], seq_lens=[24], query_lens=[24], block_size=16
    )
    shape = (2, 16, config.num_kv_heads, config.head_dim)
    caches = [(torch.zeros(shape), torch.zeros(shape)) for _ in range(config.num_layers)]
    with torch.no_grad():
        ours = model.compute_logits(model(ids, torch.arange(24), meta, caches))
        want = theirs(ids[None]).logits[0].float()
    torch.testing.assert_close(ours, want, atol=1e-4, rtol=0)
