"""The tokenizers of the encoder-decoder families load from their Hugging Face folders and give
the ids and text transformers gives on the same folder: T5's SentencePiece Unigram (whitespace
split + Metaspace, `</s>` appended by the post-processor; on the `tokenizers` library) and
BART's byte-level BPE (`<s> ... </s>` from a RobertaProcessing post-processor; on tiktoken).

The vocabularies are trained here, shaped as t5-small's and bart-base's tokenizer.json are, and
saved with transformers' own T5Tokenizer / BartTokenizerFast. Oracle: `AutoTokenizer` on the
saved folder (ids with and without special tokens, decoded text, eos) on sentences in many
scripts and on hypothesis text.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from tokenizers import Tokenizer as HfBackend
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from models.tokenizer import load_tokenizer
from tests.models.tokenizer.corpus import MULTILINGUAL, TEXTS, text_strategy
from tests.models.tokenizer.spm_files import corpus


def _t5_folder(folder):
    import transformers as tf

    backend = HfBackend(models.Unigram())
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()]
    )
    backend.decoder = decoders.Metaspace()
    trainer = trainers.UnigramTrainer(
        vocab_size=300,
        special_tokens=["<pad>", "</s>", "<unk>"],  # T5's ids 0, 1, 2
        unk_token="<unk>",
        show_progress=False,
    )
    backend.train_from_iterator(corpus() + MULTILINGUAL, trainer)
    backend.post_processor = processors.TemplateProcessing(
        single="$A </s>", pair="$A </s> $B </s>", special_tokens=[("</s>", 1)]
    )
    hf = tf.T5Tokenizer(
        tokenizer_object=backend, eos_token="</s>", unk_token="<unk>", pad_token="<pad>"
    )
    hf.save_pretrained(folder)
    return folder


def _bart_folder(folder):
    import transformers as tf

    specials = ["<s>", "<pad>", "</s>", "<unk>"]  # BART's ids 0..3
    backend = HfBackend(models.BPE())
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600,
        special_tokens=specials,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    backend.train_from_iterator(corpus() + MULTILINGUAL, trainer)
    backend.add_special_tokens(["<mask>"])
    backend.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    hf = tf.BartTokenizerFast(
        tokenizer_object=backend,
        bos_token="<s>",
        eos_token="</s>",
        unk_token="<unk>",
        pad_token="<pad>",
        mask_token="<mask>",
    )
    hf.save_pretrained(folder)
    return folder


@pytest.fixture(scope="module", params=["t5", "bart"])
def pair(request, tmp_path_factory):
    from transformers import AutoTokenizer

    make = _t5_folder if request.param == "t5" else _bart_folder
    folder = make(tmp_path_factory.mktemp(request.param))
    return load_tokenizer(folder), AutoTokenizer.from_pretrained(folder)


def _same(ours, hf, text: str) -> None:
    for special in (True, False):
        want = hf(text, add_special_tokens=special)["input_ids"]
        assert ours.encode(text, add_special_tokens=special) == want, (text, special)
    ids = hf(text)["input_ids"]
    assert ours.decode(ids) == hf.decode(ids, skip_special_tokens=True)


def test_ids_and_text_match_transformers(pair):
    ours, hf = pair
    for text in [*TEXTS, "translate English to German: The house is wonderful."]:
        _same(ours, hf, text)


@settings(max_examples=60)
@given(text=text_strategy())
def test_ids_and_text_match_transformers_on_random_text(pair, text):
    _same(*pair, text)


def test_eos_is_the_models(pair):
    ours, hf = pair
    assert ours.eos_token_ids[0] == hf.eos_token_id
    assert hf.eos_token_id in ours.special_token_ids
