"""The compiled-grammar cache is bounded in bytes as well as in count: many large distinct
grammars keep it under its cap (the least recently used dropped first), a grammar larger than
the cap is used but not kept, and a grammar llguidance gives up on is a short 400 message with
no Rust panic or backtrace in it.

Oracles: hand-worked LRU sequences; the sum of the kept entries' own size estimates; the message
llguidance 1.9 returns for a rule of 100k alternatives (copied from its output, a panic).
"""

from __future__ import annotations

import json

import pytest

from engine.grammar.grammar_cache import GrammarCache
from engine.grammar.grammar_compiler import MAX_CHOICES, GrammarCompiler, _clean
from engine.requests.structured_output import StructuredOutput
from models.tokenizer.loading import load_tokenizer
from tests.server.tiny_model import make_tiny_model


@pytest.fixture(scope="module")
def tokenizer(tmp_path_factory):
    return load_tokenizer(make_tiny_model(tmp_path_factory.mktemp("tiny") / "tiny"))


def test_the_least_recently_used_entries_go_first_until_the_bytes_fit():
    cache: GrammarCache[str] = GrammarCache(max_entries=10, max_bytes=100)
    cache.put("a", "A", 40)
    cache.put("b", "B", 40)
    assert cache.get("a") == "A"  # now "b" is the least recently used
    cache.put("c", "C", 30)  # 110 > 100: "b" goes
    assert (cache.get("a"), cache.get("b"), cache.get("c")) == ("A", None, "C")
    assert cache.bytes_held == 70
    cache.put("d", "D", 101)  # larger than the cap on its own: not kept, nothing evicted
    assert cache.get("d") is None and cache.bytes_held == 70 and len(cache) == 2
    cache.put("a", "A2", 10)  # the same key again replaces it
    assert cache.get("a") == "A2" and cache.bytes_held == 40


def test_the_count_bound_still_holds():
    cache: GrammarCache[int] = GrammarCache(max_entries=2, max_bytes=10**9)
    for key in range(5):
        cache.put(key, key, 1)
    assert len(cache) == 2 and cache.get(3) == 3 and cache.get(4) == 4 and cache.get(0) is None


def test_many_large_distinct_grammars_stay_under_the_byte_cap(tokenizer):
    cap = 8 * 1024 * 1024
    compiler = GrammarCompiler(tokenizer, 320, [0], cache_size=256, cache_bytes=cap)
    sizes = []
    for n in range(40):
        choices = [f"grammar {n} choice {i}" for i in range(300)]
        compiled = compiler.compile(StructuredOutput.from_choices(choices))
        sizes.append(compiled.size_bytes)
        assert compiler.cache_bytes_held <= cap
    assert sum(sizes) > 3 * cap  # the grammars together are far over the cap
    assert compiler.num_compiled == 40
    # The newest are kept (a hit compiles nothing), the oldest were dropped.
    compiler.compile(StructuredOutput.from_choices([f"grammar 39 choice {i}" for i in range(300)]))
    assert compiler.num_compiled == 40
    compiler.compile(StructuredOutput.from_choices([f"grammar 0 choice {i}" for i in range(300)]))
    assert compiler.num_compiled == 41


def test_a_grammar_larger_than_the_cap_is_used_but_not_kept(tokenizer):
    compiler = GrammarCompiler(tokenizer, 320, [0], cache_bytes=1024)
    compiled = compiler.compile(StructuredOutput.from_choices(["yes", "no"]))
    assert compiled.new_matcher() is not None
    assert compiler.cache_bytes_held == 0


def test_a_choice_list_past_the_cap_is_refused_before_compiling(tokenizer):
    compiler = GrammarCompiler(tokenizer, 320, [0])
    too_many = StructuredOutput("choice", json.dumps([f"c{i}" for i in range(MAX_CHOICES + 1)]))
    with pytest.raises(ValueError, match=f"at most {MAX_CHOICES}"):
        compiler.compile(too_many)
    assert compiler.num_compiled == 0


def test_a_panic_from_llguidance_never_reaches_the_message():
    raw = (
        "invalid choice: panic: assertion failed: grammar.symbols.len() < u16::MAX as usize - 10"
        "\n<backtrace>\n   0: <unknown>\n   1: <unknown>"
    )
    cleaned = _clean(raw, "choice")
    assert "panic" not in cleaned and "backtrace" not in cleaned and "u16" not in cleaned
    assert cleaned.startswith("invalid choice: it is too large")
    # An ordinary error keeps llguidance's words, shortened to its first lines.
    ordinary = "invalid regex: unclosed group\n" + "\n".join(f"line {i}" for i in range(20))
    assert _clean(ordinary, "regex").splitlines() == ordinary.splitlines()[:6]
