"""What the tokenizer cannot express is refused with a clear ValueError: SentencePiece
vocabularies (Llama 2 style BPE with byte fallback, Metaspace, Unigram, a SentencePiece
protobuf, a GGUF "llama" vocabulary), missing files and unsupported pre-tokenizer options."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from tokenizers import Tokenizer as HfBackend
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from models.tokenizer import load_tokenizer
from tests.models.tokenizer.corpus import stdlib_paragraphs


def _sentencepiece_folders(root: Path) -> list[Path]:
    corpus = stdlib_paragraphs()[:60]
    llama2 = HfBackend(models.BPE(byte_fallback=True, unk_token="<unk>"))  # Llama 2's shape
    llama2.normalizer = normalizers.Sequence(
        [normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")]
    )
    llama2.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback()])
    trainer = trainers.BpeTrainer(vocab_size=300, special_tokens=["<unk>"], show_progress=False)
    llama2.train_from_iterator(corpus, trainer)
    metaspace = HfBackend(models.BPE())
    metaspace.pre_tokenizer = pre_tokenizers.Metaspace()
    metaspace.train_from_iterator(corpus, trainers.BpeTrainer(vocab_size=300, show_progress=False))
    unigram = HfBackend(models.Unigram())
    unigram.train_from_iterator(
        corpus, trainers.UnigramTrainer(vocab_size=100, show_progress=False)
    )
    folders = []
    for name, backend in (("llama2", llama2), ("metaspace", metaspace), ("unigram", unigram)):
        (root / name).mkdir()
        backend.save(str(root / name / "tokenizer.json"))
        folders.append(root / name)
    (root / "spm").mkdir()  # a SentencePiece protobuf, not tiktoken's text format
    (root / "spm" / "tokenizer.model").write_bytes(b"\n\x0b\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02")
    return [*folders, root / "spm"]


def test_sentencepiece_vocabularies_are_refused_clearly(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "spm.gguf"), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>", "▁a"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    for path in [*_sentencepiece_folders(tmp_path), tmp_path / "spm.gguf"]:
        with pytest.raises(ValueError, match="SentencePiece.*tiktoken ranks.*token-id prompts"):
            load_tokenizer(path)


def test_unsupported_inputs_raise_value_error(tmp_path, trained):
    with pytest.raises(ValueError, match="no such file"):
        load_tokenizer(tmp_path / "missing")
    with pytest.raises(ValueError, match="no tokenizer.json"):
        load_tokenizer(tmp_path)
    data = json.loads((trained["gpt2"] / "tokenizer.json").read_text())
    data["pre_tokenizer"]["add_prefix_space"] = True
    (tmp_path / "tokenizer.json").write_text(json.dumps(data))
    with pytest.raises(ValueError, match="add_prefix_space"):
        load_tokenizer(tmp_path)
