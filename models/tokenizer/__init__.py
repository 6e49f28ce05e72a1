"""Tokenizers: a model's byte-level BPE tokenizer on tiktoken (SentencePiece vocabularies on the
`tokenizers` library), its special tokens and its chat template. `load_tokenizer(path)` (a Hugging
Face folder or a GGUF file) is the entry point.
Modules: `loading` (`load_tokenizer`), `tokenizer` (the `Tokenizer` on tiktoken), `bpe_sources`
(tokenizer files -> `BpeVocab`), `bpe_vocab` (the `BpeVocab` and GPT-2's byte alphabet),
`patterns` (pre-tokenizer regexes), `chat_template` (jinja2 rendering as transformers does),
`sentencepiece` (`SentencePieceTokenizer`: SentencePiece tokenizer.json files).
"""

from models.tokenizer.loading import load_tokenizer
from models.tokenizer.sentencepiece import SentencePieceTokenizer
from models.tokenizer.tokenizer import SpecialTokens, Tokenizer

__all__ = ["SentencePieceTokenizer", "SpecialTokens", "Tokenizer", "load_tokenizer"]
