"""Tiny seeded random encoder-decoder checkpoints made with transformers (the test oracle).

`save_encdec_checkpoint(kind, folder)` writes config.json + model.safetensors as a real folder
looks: "t5v10" (ReLU, tied head, outputs scaled), "t5v11" (gated-GELU, untied head: written into
the file with `tie_word_embeddings` false, as flan-t5's folders are), "bart" (post-norm, a
non-zero final_logits_bias) and "mbart" (pre-norm, scaled embeddings). `load_hf(folder)` loads
transformers' model from the folder, eager attention, float32.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from tokenizers import Tokenizer as HfBackend
from tokenizers import decoders, models, pre_tokenizers, processors, trainers

from tests.models.tokenizer.corpus import MULTILINGUAL
from tests.models.tokenizer.spm_files import corpus

VOCAB = 96
KINDS = ("t5v10", "t5v11", "bart", "mbart")

_T5 = dict(
    vocab_size=VOCAB,
    d_model=48,
    d_kv=12,
    d_ff=80,
    num_layers=2,
    num_decoder_layers=3,  # unequal stacks: the cache follows the decoder
    num_heads=4,
    relative_attention_num_buckets=8,
    relative_attention_max_distance=16,  # short: the logarithmic buckets are used
    decoder_start_token_id=0,
    pad_token_id=0,
    eos_token_id=1,
    initializer_factor=3.0,  # wider than transformers' default: outputs that vary with context
)
_BART = dict(
    vocab_size=VOCAB,
    d_model=48,
    encoder_layers=2,
    decoder_layers=3,
    encoder_attention_heads=4,
    decoder_attention_heads=6,
    encoder_ffn_dim=80,
    decoder_ffn_dim=64,
    max_position_embeddings=128,
    bos_token_id=0,
    pad_token_id=1,
    eos_token_id=2,
    decoder_start_token_id=2,
    forced_eos_token_id=None,
    init_std=1.0,  # transformers' 0.02 leaves the logits to final_logits_bias alone
)


def _make(kind: str, seed: int, vocab: int):
    import transformers as tf

    torch.manual_seed(seed)
    if kind == "t5v10":
        config = tf.T5Config(
            **_T5 | {"vocab_size": vocab}, feed_forward_proj="relu", tie_word_embeddings=True
        )
        cls = tf.T5ForConditionalGeneration
    elif kind == "t5v11":
        config = tf.T5Config(
            **_T5 | {"vocab_size": vocab}, feed_forward_proj="gated-gelu", tie_word_embeddings=False
        )
        cls = tf.T5ForConditionalGeneration
    elif kind == "bart":
        config = tf.BartConfig(**_BART | {"vocab_size": vocab})
        cls = tf.BartForConditionalGeneration
    elif kind == "mbart":
        config = tf.MBartConfig(**_BART | {"vocab_size": vocab}, scale_embedding=True)
        cls = tf.MBartForConditionalGeneration
    else:
        raise ValueError(kind)
    config._attn_implementation = "eager"
    model = cls(config).eval()
    with torch.no_grad():  # random init leaves these at zero / one: make them matter
        for name, param in model.named_parameters():
            if name.endswith("bias") or "layer_norm" in name or "layernorm" in name:
                param.add_(torch.randn_like(param) * 0.2)
        if kind in ("bart", "mbart"):
            model.final_logits_bias.normal_(0, 0.5)
    return model


def save_encdec_checkpoint(kind: str, folder: Path, seed: int = 0, vocab: int = VOCAB) -> Path:
    model = _make(kind, seed, vocab)
    model.save_pretrained(folder)
    if kind == "t5v11":  # transformers >= 5 saves T5 tied; flan-t5 folders hold lm_head
        from safetensors.torch import load_file, save_file

        tensors = load_file(folder / "model.safetensors")
        torch.manual_seed(seed + 1)
        tensors["lm_head.weight"] = torch.randn(vocab, _T5["d_model"]) * 0.5
        save_file(tensors, folder / "model.safetensors", metadata={"format": "pt"})
        config = json.loads((folder / "config.json").read_text())
        config.pop("scale_decoder_outputs", None)
        config["tie_word_embeddings"] = False
        (folder / "config.json").write_text(json.dumps(config))
    return folder


def save_encdec_tokenizer(family: str, folder: Path) -> Path:
    """A tokenizer trained here, shaped as t5-small's ("t5": SentencePiece Unigram, `</s>`
    appended) or bart-base's ("bart": byte-level BPE, `<s> ... </s>`), saved with transformers'
    own tokenizer class into `folder`."""
    (_t5_tokenizer if family == "t5" else _bart_tokenizer)(folder)
    return folder


def _t5_tokenizer(folder: Path) -> None:
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


def _bart_tokenizer(folder: Path) -> None:
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


def load_hf(folder: Path, dtype: torch.dtype = torch.float32):
    import transformers as tf

    config = json.loads((folder / "config.json").read_text())
    cls = getattr(tf, config["architectures"][0])
    model = cls.from_pretrained(folder, dtype=dtype, attn_implementation="eager")
    return model.eval()
