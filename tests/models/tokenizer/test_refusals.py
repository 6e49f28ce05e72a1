"""What the tokenizer cannot express is refused with a clear ValueError: SentencePiece
vocabularies without a tokenizer.json (a SentencePiece protobuf, a GGUF "llama" vocabulary;
those with one load: test_sentencepiece.py), missing files and unsupported pre-tokenizer
options."""

from __future__ import annotations

import json

import gguf
import pytest

from models.tokenizer import load_tokenizer


def test_sentencepiece_files_without_a_tokenizer_json_are_refused_clearly(tmp_path):
    writer = gguf.GGUFWriter(str(tmp_path / "spm.gguf"), "llama")
    writer.add_tokenizer_model("llama")
    writer.add_token_list(["<unk>", "<s>", "</s>", "▁a"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.close()
    (tmp_path / "spm").mkdir()  # a SentencePiece protobuf, not tiktoken's text format
    (tmp_path / "spm" / "tokenizer.model").write_bytes(
        b"\n\x0b\n\x05<unk>\x15\x00\x00\x00\x00\x18\x02"
    )
    for path in (tmp_path / "spm", tmp_path / "spm.gguf"):
        with pytest.raises(ValueError, match="SentencePiece.*tokenizer.json.*token-id prompts"):
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
