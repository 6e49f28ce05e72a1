"""Loading a tokenizer: a Hugging Face model folder or a GGUF file -> `Tokenizer`.

Contract: `load_tokenizer(path)` takes a Hugging Face folder (tokenizer.json, or a Llama-3
tiktoken-format tokenizer.model; tokenizer_config.json, generation_config.json and config.json for
special tokens) or a GGUF file, and returns a `Tokenizer` (models/tokenizer/tokenizer.py) whose
ids equal the model's own tokenizer. `encode(..., add_special_tokens=True)` adds what the
tokenizer's post-processor (or GGUF add_bos/add_eos, or a tiktoken folder's add_bos_token) says;
eos ids are the tokenizer's eos token, then generation_config.json's, then config.json's. The chat
template comes from chat_template.jinja, tokenizer_config.json or the GGUF metadata. Anything
that cannot load raises ValueError naming the file. A SentencePiece `tokenizer.json` (Llama 2,
Mistral v0.1, TinyLlama, Gemma) loads as a `SentencePieceTokenizer` on the `tokenizers` library
(models/tokenizer/sentencepiece.py), same interface; a SentencePiece protobuf `tokenizer.model`
or a GGUF "llama" vocabulary is refused (see models/tokenizer/bpe_sources.py).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from models.gguf.header import read_gguf_metadata
from models.tokenizer.bpe_sources import (
    read_gguf_vocab,
    read_tiktoken_model,
    read_tokenizer_json,
    sentencepiece_reason,
)
from models.tokenizer.bpe_vocab import AddedToken, BpeVocab
from models.tokenizer.patterns import LLAMA3_PATTERN
from models.tokenizer.sentencepiece import SentencePieceTokenizer
from models.tokenizer.tokenizer import SpecialTokens, Tokenizer

__all__ = ["load_tokenizer"]


def load_tokenizer(path: str | Path) -> Tokenizer | SentencePieceTokenizer:
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


def _from_folder(folder: Path) -> Tokenizer | SentencePieceTokenizer:
    config = _read_json(folder / "tokenizer_config.json")
    roles = _folder_roles(folder, config)
    has_json = (folder / "tokenizer.json").is_file()
    if has_json:
        data = _read_json(folder / "tokenizer.json")
        prefix, suffix = _post_processor_ids(data.get("post_processor"))
        if sentencepiece_reason(data) is not None:  # tiktoken cannot express it
            return _sentencepiece(folder, data, config, roles, (prefix, suffix))
        vocab = read_tokenizer_json(data, str(folder / "tokenizer.json"))
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

    def id_of(text: str | None) -> int | None:
        return None if text is None else by_text.get(text, vocab.tokens.get(text.encode("utf-8")))

    if not has_json:  # a tiktoken file has no post-processor: the config decides
        bos_id = id_of(roles.get("bos_token"))
        prefix = (bos_id,) if config.get("add_bos_token") and bos_id is not None else ()
    specials = _folder_specials(folder, roles, id_of, prefix, suffix)
    return Tokenizer(vocab, specials, _folder_chat_template(folder, config))


def _sentencepiece(
    folder: Path,
    data: dict[str, Any],
    config: dict[str, Any],
    roles: dict[str, str],
    affixes: tuple[tuple[int, ...], tuple[int, ...]],
) -> SentencePieceTokenizer:
    ids = {entry["content"]: int(entry["id"]) for entry in data.get("added_tokens") or ()}
    vocab = (data.get("model") or {}).get("vocab")
    if isinstance(vocab, dict):  # BPE: {piece: id}
        ids = {**vocab, **ids}
    elif isinstance(vocab, list):  # Unigram: [[piece, score], ...] in id order
        ids = {entry[0]: i for i, entry in enumerate(vocab)} | ids
    specials = _folder_specials(folder, roles, ids.get, *affixes)
    text = (folder / "tokenizer.json").read_text(encoding="utf-8")
    source = str(folder / "tokenizer.json")
    return SentencePieceTokenizer(text, specials, _folder_chat_template(folder, config), source)


def _folder_roles(folder: Path, config: dict[str, Any]) -> dict[str, str]:
    """The text of the bos / eos / unk / pad tokens the folder's configs name."""
    legacy = _read_json(folder / "special_tokens_map.json")  # older folders keep the roles here
    roles: dict[str, str] = {}
    for role in ("bos_token", "eos_token", "unk_token", "pad_token"):
        value = config.get(role, legacy.get(role))
        text = value.get("content") if isinstance(value, dict) else value
        if isinstance(text, str):
            roles[role] = text
    return roles


def _folder_specials(
    folder: Path,
    roles: dict[str, str],
    id_of: Callable[[str], int | None],
    prefix: tuple[int, ...],
    suffix: tuple[int, ...],
) -> SpecialTokens:
    """bos and eos ids: the tokenizer's roles, then generation_config.json's, then config.json's."""
    generation = _read_json(folder / "generation_config.json")
    model_config = _read_json(folder / "config.json")
    bos = id_of(roles["bos_token"]) if "bos_token" in roles else None
    if bos is None:
        bos = generation.get("bos_token_id", model_config.get("bos_token_id"))
    eos = [id_of(roles["eos_token"]) if "eos_token" in roles else None]
    for source in (generation, model_config):
        value = source.get("eos_token_id")
        eos += value if isinstance(value, list) else [value]
    return SpecialTokens(bos, _unique(eos), prefix, suffix, tuple(roles.items()))


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
