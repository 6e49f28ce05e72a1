"""Texts the tokenizer tests encode: hand-picked edge cases, real code and prose from the
standard library, and a hypothesis strategy mixing random text with tricky fragments."""

from __future__ import annotations

import importlib
import inspect

from hypothesis import strategies as st

TEXTS = [
    "",
    "Hello, world!",
    'def f(x):\n    return {"a": [1, 2, 3]}  # comment\n\tif x != 0:\n\t\tprint(f"{x:>10}")\n',
    "a  b   c    d\t\t e \n \n\n\n  f",
    "   leading and trailing   ",
    "\n\n\n",
    "  \t \u00a0\u3000 x \u2003y",
    "1234567890 3.14159 -42 1,000,000 2024-01-01 0x1F 1e-9",
    "12 345 6789\n2024\n\n 7  8\t9",
    "你好，世界！こんにちは世界。안녕하세요 세계",
    "😀👍🏽 👨‍👩‍👧‍👦 🇫🇷 ❤️ ✨",
    "café naïve Ångström façade Straße crème brûlée Œuvre",
    "e\u0301 a\u0308 o\u0302",
    "Привет, мир! Γειά σου Κόσμε مرحبا بالعالم नमस्ते दुनिया",
    "don't I'll we're THEY'VE she'd it's O'Neil",
    "!!!??? ... --- *** ((( ))) <html><body>&amp;</body></html>",
    "line1\r\nline2\r\n\r\n3",
    "a" * 300 + " " * 100 + "b",
]


def stdlib_paragraphs() -> list[str]:
    """Real code and prose: paragraphs of a few standard-library modules."""
    parts: list[str] = []
    for name in ("json.decoder", "argparse", "textwrap", "string"):
        parts += inspect.getsource(importlib.import_module(name)).split("\n\n")
    return parts


MULTILINGUAL = [t for t in TEXTS if t] * 20

FRAGMENTS = st.sampled_from(
    [" ", "  ", "\n", "\n\n", "\t", "\r\n", "1", "23", " 4", "'s", "'LL", "é", "e\u0301", "你好",
     "😀", "👍🏽", "\u00a0", "<|im_start|>", "<|im_end|>", "<|endoftext|>", "word", " Word", "!?"]
)  # fmt: skip


def text_strategy(alphabet: st.SearchStrategy[str] | None = None) -> st.SearchStrategy[str]:
    chars = st.text(st.characters(codec="utf-8") if alphabet is None else alphabet, max_size=12)
    return st.lists(st.one_of(chars, FRAGMENTS), max_size=12).map("".join)
