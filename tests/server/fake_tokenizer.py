"""The fake engine's byte-level tokenizer and its greedy model, a closed formula of the prompt:
the oracle that server tests compute expected texts from."""

from __future__ import annotations

import codecs

BOS, EOS = 256, 257
EURO = "€".encode()  # a prompt holding it makes the fake model write "€" a byte per token
SPECIAL_TEXT = {BOS: "<s>", EOS: "</s>"}


class FakeTokenizer:
    """Token i < 256 is the byte i; 256/257 are BOS/EOS."""

    vocab_size = 258
    bos_token_id = BOS
    eos_token_ids = (EOS,)

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return ([BOS] if add_special_tokens else []) + list(text.encode("utf-8"))

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return b"".join(
            b"" if (i in SPECIAL_TEXT and skip_special_tokens) else self.token_bytes(i) for i in ids
        ).decode("utf-8", errors="replace")

    def decode_stable(self, ids) -> str:
        """The text of `ids` less the bytes of a character not complete yet: what the real
        detokenizer shows while streaming, and the final text when the output ends there."""
        data = b"".join(b"" if i in SPECIAL_TEXT else self.token_bytes(i) for i in ids)
        return codecs.getincrementaldecoder("utf-8")("replace").decode(data, final=False)

    def token_bytes(self, token_id: int) -> bytes:
        return SPECIAL_TEXT[token_id].encode() if token_id in SPECIAL_TEXT else bytes([token_id])

    def is_special(self, token_id: int) -> bool:
        return token_id in SPECIAL_TEXT

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        text = "".join(f"[{m['role']}]{m['content']}\n" for m in messages)
        return text + ("[assistant]" if add_generation_prompt else "")


def greedy_token(prompt: list[int], position: int, index: int = 0) -> int:
    """The fake model's greedy choice: lowercase letters, a space every 5th token; after a
    prompt holding "€", the bytes of "€" over and over (a character split over 3 tokens)."""
    if EURO in bytes(t for t in prompt if t < 256):
        return EURO[position % len(EURO)]
    if position % 5 == 4:
        return ord(" ")
    return ord("a") + (sum(prompt) + 7 * position + 3 * index) % 26


def expected_greedy_text(prompt: list[int], max_tokens: int, index: int = 0) -> str:
    """The oracle: what a greedy request of max_tokens must return (no stop strings, no EOS; the
    bytes of a character the length finish cuts are dropped)."""
    ids = [greedy_token(prompt, p, index) for p in range(max_tokens)]
    return FakeTokenizer().decode_stable(ids)
