"""Tokenizer: a model's byte-level BPE tokenizer on a tiktoken Encoding, plus its special tokens
and chat template.

Contract: `load_tokenizer(path)` takes a Hugging Face folder (tokenizer.json, or a Llama-3
tiktoken-format tokenizer.model; tokenizer_config.json, generation_config.json and config.json for
special tokens) or a GGUF file, and returns a `Tokenizer` whose ids equal the model's own
tokenizer: added/special token text in the input is matched whole (as HF does), `encode(...,
add_special_tokens=True)` adds what the tokenizer's post-processor (or GGUF add_bos/add_eos) says.
SentencePiece vocabularies raise ValueError at load (see models/tokenizer/bpe_sources.py).

tiktoken ranks are the token ids when the file's merge order agrees with id order (true for every
real byte-level BPE we know); otherwise ranks are derived from the merges and mapped back to ids.
Known gaps to HF: a byte with no token (SmolLM2 lacks b"\\x16") is left out of the ids as HF
does, but HF removes it before BPE, so its neighbours may merge (" \\x16{" -> "Ġ{"), and we after;
added tokens' lstrip/rstrip/single_word flags are ignored.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tiktoken

from models.gguf.header import read_gguf_metadata
from models.tokenizer.bpe_sources import (
    LLAMA3_PATTERN,
    AddedToken,
    BpeVocab,
    read_gguf_vocab,
    read_tiktoken_model,
    read_tokenizer_json,
)
from models.tokenizer.chat_template import ChatTemplate

__all__ = ["SpecialTokens", "Tokenizer", "load_tokenizer"]


@dataclass(frozen=True)
class SpecialTokens:
    bos_token_id: int | None
    eos_token_ids: tuple[int, ...]
    prefix_ids: tuple[int, ...] = ()  # added by encode(add_special_tokens=True) before the text
    suffix_ids: tuple[int, ...] = ()  # ... and after it
    names: tuple[tuple[str, str], ...] = ()  # ("bos_token", "<|im_start|>"), ... for templates


class Tokenizer:
    """Thread-safe and immutable after construction; see the module docstring for the contract."""

    def __init__(self, vocab: BpeVocab, specials: SpecialTokens, chat_template: str | None) -> None:
        ranks, rank_to_id = _mergeable_ranks(vocab)
        added = {t.content: t.token_id for t in vocab.added}
        if rank_to_id is not None:  # give added tokens ranks after the mergeable ones
            for content in added:
                rank_to_id.append(added[content])
                added[content] = len(rank_to_id) - 1
        try:
            self._encoding = tiktoken.Encoding(
                name=f"tgserve:{vocab.source}",
                pat_str=vocab.pattern,
                mergeable_ranks=ranks,
                special_tokens=added,
            )
        except ValueError as exc:  # e.g. a pre-tokenizer regex fancy-regex cannot parse
            raise ValueError(f"{vocab.source}: tiktoken rejected the vocabulary: {exc}") from exc
        self._rank_to_id = rank_to_id
        self._nfc = vocab.nfc
        self._specials = specials
        self._split_added = _overlap_splitter(vocab.added)
        self._bytes = {i: b for b, i in vocab.tokens.items()}
        self._bytes.update({t.token_id: t.content.encode("utf-8") for t in vocab.added})
        self.vocab_size: int = max(self._bytes) + 1
        self.bos_token_id: int | None = specials.bos_token_id
        self.eos_token_ids: tuple[int, ...] = specials.eos_token_ids
        special = frozenset(t.token_id for t in vocab.added if t.special)
        self.special_token_ids: frozenset[int] = special
        names = dict(specials.names)
        self._chat_template = ChatTemplate(chat_template, names) if chat_template else None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        if not isinstance(text, str):
            raise ValueError(f"encode() takes a str, got {type(text).__name__}")
        if self._nfc:
            text = unicodedata.normalize("NFC", text)
        if self._split_added is None:
            ranks = self._encoding.encode(text, allowed_special="all", disallowed_special=())
        else:  # added tokens that prefix one another: match the longest first, as HF does
            ranks = []
            for i, piece in enumerate(self._split_added.split(text)):
                if i % 2:
                    ranks.append(self._encoding.encode_single_token(piece))
                elif piece:
                    ranks.extend(self._encoding.encode_ordinary(piece))
        ids = ranks if self._rank_to_id is None else [self._rank_to_id[r] for r in ranks]
        if ids and max(ids) >= self.vocab_size:  # bytes the vocabulary lacks: HF drops them
            ids = [i for i in ids if i < self.vocab_size]
        if add_special_tokens:
            ids = [*self._specials.prefix_ids, *ids, *self._specials.suffix_ids]
        return ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        skip = self.special_token_ids if skip_special_tokens else frozenset()
        try:
            data = b"".join(self._bytes[i] for i in ids if i not in skip)
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{exc.args[0]!r} is not a token id of this vocabulary") from exc
        return data.decode("utf-8", errors="replace")

    def token_bytes(self, token_id: int) -> bytes:
        """The raw bytes of one token (may be part of a UTF-8 character); special tokens give
        their text as UTF-8."""
        try:
            return self._bytes[token_id]
        except (KeyError, TypeError) as exc:
            raise ValueError(f"{token_id!r} is not a token id of this vocabulary") from exc

    def is_special(self, token_id: int) -> bool:
        return token_id in self.special_token_ids

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **kwargs: Any
    ) -> str:
        if self._chat_template is None:
            raise ValueError("this model has no chat template; send a plain prompt instead")
        return self._chat_template.render(messages, add_generation_prompt, **kwargs)


def _mergeable_ranks(vocab: BpeVocab) -> tuple[dict[bytes, int], list[int] | None]:
    """tiktoken ranks: the ids themselves when the merges produce tokens in increasing id order,
    else ranks in merge order plus the rank -> id table. tiktoken merges the adjacent pair whose
    concatenation has the lowest rank, so rank order must be the merges' priority order."""
    limit = 1 + max(max(vocab.tokens.values()), max((t.token_id for t in vocab.added), default=0))
    products = []
    for left, right in vocab.merges:
        for part in (left, right, left + right):
            if part not in vocab.tokens:
                raise ValueError(f"{vocab.source}: a merge uses the unknown token {part!r}")
        products.append(vocab.tokens[left + right])
    if all(a < b for a, b in zip(products, products[1:], strict=False)):
        return _with_all_bytes(dict(vocab.tokens), limit), None
    order = [bytes([b]) for b in range(256) if bytes([b]) in vocab.tokens]
    order += [left + right for left, right in vocab.merges]
    order += sorted(vocab.tokens, key=vocab.tokens.__getitem__)  # tokens no merge makes, last
    ranks: dict[bytes, int] = {}
    for token in order:
        ranks.setdefault(token, len(ranks))
    rank_to_id = [vocab.tokens[token] for token in ranks]
    ranks = _with_all_bytes(ranks, len(ranks))
    rank_to_id += range(limit, limit + len(ranks) - len(rank_to_id))
    return ranks, rank_to_id


def _with_all_bytes(ranks: dict[bytes, int], first_free: int) -> dict[bytes, int]:
    """tiktoken needs a rank for every byte; a vocabulary may lack some (SmolLM2 has no token for
    b"\\x04"). HF drops such bytes from the output, so they get phantom ids >= the vocabulary
    size, which encode() filters out."""
    for b in range(256):
        if bytes([b]) not in ranks:
            ranks[bytes([b])] = first_free
            first_free += 1
    return ranks


def _overlap_splitter(added: tuple[AddedToken, ...]) -> re.Pattern[str] | None:
    """A longest-first regex over the added tokens when one is a prefix of another (tiktoken's
    own matching would then pick either); None when tiktoken's matching is already exact."""
    ordered = sorted({t.content for t in added if t.content})
    # In sorted order a token and any token it prefixes are adjacent-or-chained, so pairs suffice.
    if not any(b.startswith(a) for a, b in zip(ordered, ordered[1:], strict=False)):
        return None
    longest_first = sorted(ordered, key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(c) for c in longest_first) + ")")


def load_tokenizer(path: str | Path) -> Tokenizer:
    """The tokenizer of a HF model folder or a GGUF file; ValueError for what cannot load."""
    path = Path(path)
    if path.is_dir():
        return _from_folder(path)
    if path.is_file():
        with path.open("rb") as f:
            is_gguf = f.read(4) == b"GGUF"
        if is_gguf:
            return _from_gguf(path)
        raise ValueError(f"{path}: not a GGUF file; pass a GGUF file or a model folder")
    raise ValueError(f"{path}: no such file or folder")


def _from_gguf(path: Path) -> Tokenizer:
    meta = read_gguf_metadata(path)
    vocab = read_gguf_vocab(meta, str(path))
    names: list[str] = meta["tokenizer.ggml.tokens"]  # present: read_gguf_vocab checked

    def token_id(key: str) -> int | None:
        value = meta.get(f"tokenizer.ggml.{key}")
        return value if value is not None and 0 <= value < len(names) else None

    bos = token_id("bos_token_id")
    eos = [token_id(k) for k in ("eos_token_id", "eot_token_id", "eom_token_id")]
    prefix = (bos,) if bos is not None and meta.get("tokenizer.ggml.add_bos_token") else ()
    suffix = (eos[0],) if eos[0] is not None and meta.get("tokenizer.ggml.add_eos_token") else ()
    roles = {"bos_token": bos, "eos_token": eos[0], "unk_token": token_id("unknown_token_id")}
    roles["pad_token"] = token_id("padding_token_id")
    role_names = tuple((role, names[i]) for role, i in roles.items() if i is not None)
    specials = SpecialTokens(bos, _unique(eos), prefix, suffix, role_names)
    return Tokenizer(vocab, specials, meta.get("tokenizer.chat_template"))


def _from_folder(folder: Path) -> Tokenizer:
    config = _read_json(folder / "tokenizer_config.json")
    has_json = (folder / "tokenizer.json").is_file()
    if has_json:
        data = _read_json(folder / "tokenizer.json")
        vocab = read_tokenizer_json(data, str(folder / "tokenizer.json"))
        prefix, suffix = _post_processor_ids(data.get("post_processor"))
    elif (folder / "tokenizer.model").is_file():
        vocab = read_tiktoken_model(folder / "tokenizer.model", LLAMA3_PATTERN)
        added = tuple(
            AddedToken(int(i), t["content"], bool(t.get("special", False)))
            for i, t in (config.get("added_tokens_decoder") or {}).items()
        )
        vocab = BpeVocab(vocab.source, vocab.tokens, (), added, vocab.pattern)
        prefix = suffix = ()
    else:
        raise ValueError(f"{folder}: no tokenizer.json or tokenizer.model to build a tokenizer")

    by_text = {t.content: t.token_id for t in vocab.added}
    legacy = _read_json(folder / "special_tokens_map.json")  # older folders keep the roles here
    roles: dict[str, str] = {}
    for role in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(role, legacy.get(role))
        text = value.get("content") if isinstance(value, dict) else value
        if isinstance(text, str):
            roles[role] = text

    def id_of(text: str | None) -> int | None:
        return None if text is None else by_text.get(text, vocab.tokens.get(text.encode("utf-8")))

    if not has_json:  # a tiktoken file has no post-processor: the config decides
        bos_id = id_of(roles.get("bos_token"))
        prefix = (bos_id,) if config.get("add_bos_token") and bos_id is not None else ()
    generation = _read_json(folder / "generation_config.json")
    model_config = _read_json(folder / "config.json")
    bos = id_of(roles.get("bos_token"))
    if bos is None:
        bos = generation.get("bos_token_id", model_config.get("bos_token_id"))
    eos = [id_of(roles.get("eos_token"))]
    for source in (generation, model_config):
        value = source.get("eos_token_id")
        eos += value if isinstance(value, list) else [value]
    specials = SpecialTokens(bos, _unique(eos), prefix, suffix, tuple(roles.items()))
    return Tokenizer(vocab, specials, _folder_chat_template(folder, config))


def _folder_chat_template(folder: Path, config: dict[str, Any]) -> str | None:
    # transformers prefers chat_template.jinja over the tokenizer_config.json entry.
    if (folder / "chat_template.jinja").is_file():
        return (folder / "chat_template.jinja").read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):  # named templates: [{"name": "default", "template": ...}, ...]
        named = {t.get("name"): t.get("template") for t in template}
        return named.get("default")
    return template if isinstance(template, str) else None


def _post_processor_ids(post: dict[str, Any] | None) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Token ids a tokenizer.json post-processor puts before and after a single sequence."""
    if not post:
        return (), ()
    kind = post.get("type")
    if kind == "Sequence":
        for inner in post.get("processors") or ():
            ids = _post_processor_ids(inner)
            if ids != ((), ()):
                return ids
        return (), ()
    if kind in ("RobertaProcessing", "BertProcessing"):
        return (int(post["cls"][1]),), (int(post["sep"][1]),)
    if kind != "TemplateProcessing":
        return (), ()
    ids: tuple[list[int], list[int]] = ([], [])
    side = 0
    for piece in post.get("single") or ():
        if "Sequence" in piece:
            side = 1
        else:
            name = piece["SpecialToken"]["id"]
            ids[side].extend(post["special_tokens"][name]["ids"])
    return tuple(ids[0]), tuple(ids[1])


def _unique(ids: Iterable[int | None]) -> tuple[int, ...]:
    return tuple(dict.fromkeys(int(i) for i in ids if i is not None))


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ValueError(f"{path}: invalid JSON ({exc})") from exc
    return data if isinstance(data, dict) else {}
