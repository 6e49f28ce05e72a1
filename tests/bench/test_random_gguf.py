"""`tgserve bench write-gguf` (bench/random_gguf.py): the file is a Llama in the asked shape and
type, with the vocabulary copied from the source GGUF, and tgserve loads it as stored."""

from __future__ import annotations

import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

from bench import random_gguf
from bench.random_gguf import write_random_gguf
from models.block_linear import BlockEmbedding, BlockLinear
from models.loader import load_model
from tests.bench.conftest import TINY


@pytest.mark.parametrize("qtype", ["Q4_1", "Q8_0"])
def test_written_gguf_has_the_shape_type_and_vocabulary_asked_for(
    tmp_path, random_gguf_writer, default_vocab_reader, tiny_q4_1_gguf, qtype
):
    """The Q4_1 file is the session's shared one (tests/bench/conftest.py), written as here."""
    if qtype == "Q4_1":
        path = tiny_q4_1_gguf
    else:
        path = write_random_gguf(tmp_path / "tiny.gguf", qtype, shape="tiny")
    reader = GGUFReader(path)
    vocab = default_vocab_reader.fields["tokenizer.ggml.tokens"]
    assert reader.fields["tokenizer.ggml.tokens"].contents() == vocab.contents()
    matrices = {t.name: QT(t.tensor_type) for t in reader.tensors if len(t.shape) == 2}
    assert len(matrices) == 1 + 7 * 2 and set(matrices.values()) == {QT[qtype]}
    model, config = load_model(path, "float32", "cpu")
    assert (config.num_layers, config.hidden_size, config.intermediate_size) == (2, 64, 96)
    assert (config.num_heads, config.num_kv_heads, config.vocab_size) == (4, 2, len(vocab.data))
    assert config.tie_word_embeddings
    assert isinstance(model.model.embed_tokens, BlockEmbedding)
    assert isinstance(model.model.layers[1].mlp.gate_up_proj, BlockLinear)


def test_unwritable_type_is_refused_with_the_choices(tmp_path):
    with pytest.raises(ValueError, match="Q4_1"):
        write_random_gguf(tmp_path / "x.gguf", "Q2_K")


def test_q4_k_m_file_has_llama_quantizes_type_mix_and_loads_as_stored(
    tmp_path, monkeypatch, random_gguf_writer
):
    # 8 layers: llama.cpp's use_more_bits gives layers 0, 3, 6, 7 Q6_K attn_v and ffn_down
    shape = TINY | dict(block_count=8, embedding_length=256, feed_forward_length=512)
    monkeypatch.setitem(random_gguf.SHAPES, "tiny-k", shape)
    path = write_random_gguf(tmp_path / "k.gguf", "Q4_K_M", shape="tiny-k")
    types = {t.name: QT(t.tensor_type) for t in GGUFReader(path).tensors if len(t.shape) == 2}
    more_bits = {0, 3, 6, 7}
    for name, qtype in types.items():
        part = name.split(".")
        wide = name == "token_embd.weight" or (
            part[2] in ("attn_v", "ffn_down") and int(part[1]) in more_bits
        )
        assert qtype == (QT.Q6_K if wide else QT.Q4_K), name
    model, _ = load_model(path, "bfloat16", "cpu")
    qkv = [layer.self_attn.qkv_proj.block_weight for layer in model.model.layers]
    assert [w.qtype is None for w in qkv] == [i in more_bits for i in range(8)]  # mixed q/k/v
    assert model.lm_head.block_weight.qtype == QT.Q6_K
