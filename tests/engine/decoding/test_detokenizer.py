"""Incremental detokenizer: byte-exact UTF-8, stop strings across tokens, exact streaming."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.decoding.detokenizer import IncrementalDetokenizer
from engine.requests.sampling_params import SamplingParams

SPECIAL = b"<|eot|>"


class FakeByteTokenizer:
    """Byte-level vocabulary: ids 0..255 are single bytes, merged tokens are added on demand
    (so a token may hold any byte string, including part of a character); id 1000 is special."""

    SPECIAL_ID = 1000

    def __init__(self) -> None:
        self._bytes = {i: bytes([i]) for i in range(256)}
        self._ids = {b: i for i, b in self._bytes.items()}

    def id_of(self, piece: bytes) -> int:
        if piece not in self._ids:
            self._ids[piece] = len(self._bytes) + 1001
            self._bytes[self._ids[piece]] = piece
        return self._ids[piece]

    def token_bytes(self, token_id: int) -> bytes:
        return SPECIAL if token_id == self.SPECIAL_ID else self._bytes[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id == self.SPECIAL_ID


def tokenize(tok: FakeByteTokenizer, data: bytes, cuts: list[int]) -> list[int]:
    bounds = [0, *sorted({c for c in cuts if 0 < c < len(data)}), len(data)]
    return [tok.id_of(data[a:b]) for a, b in zip(bounds, bounds[1:], strict=False) if b > a]


def stream(detok: IncrementalDetokenizer, ids: list[int]) -> tuple[list[str], list[int]]:
    """Feeds ids until a stop; returns the deltas (last one from finish()) and the ids fed.
    Fails if emitted text is ever retracted."""
    deltas, fed, sent = [], [], ""
    for token_id in ids:
        detok.add(token_id)
        fed.append(token_id)
        assert detok.text.startswith(sent), "emitted text was retracted"
        deltas.append(detok.text[len(sent) :])
        sent = detok.text
        if detok.stop_string is not None:
            break
    final = detok.finish()
    assert final.startswith(sent) and detok.text == final
    deltas.append(final[len(sent) :])
    return deltas, fed


def cut_at_first_stop(
    text: str, stops: list[str], include: bool, armed_from: int = 0
) -> tuple[str, str | None]:
    """Naive oracle: the first end position (at or after `armed_from`) at which some stop ends;
    the longest such stop wins; cut before it (or after it with `include`)."""
    for end in range(1, len(text) + 1):
        hits = [
            s for s in stops if end >= max(len(s), armed_from + 1) and text[end - len(s) : end] == s
        ]
        if hits:
            stop = max(hits, key=len)
            return text[: end if include else end - len(stop)], stop
    return text, None


CHARS = st.one_of(
    st.sampled_from(list("ab \n")),
    st.characters(min_codepoint=0x20, max_codepoint=0x7E),
    st.sampled_from(["é", "ß", "\u0301", "\u0308", "Ω", "\u200d"]),  # 2-byte and combining marks
    st.characters(min_codepoint=0x4E00, max_codepoint=0x4E10),  # CJK, 3 bytes
    st.characters(min_codepoint=0x1F600, max_codepoint=0x1F60F),  # emoji, 4 bytes
)
TEXTS = st.text(alphabet=CHARS, max_size=40)


@st.composite
def streams(draw):
    text = draw(TEXTS)
    data = text.encode()
    cuts = draw(st.lists(st.integers(0, max(len(data), 1)), max_size=len(data)))
    stops = []
    for _ in range(draw(st.integers(0, 3))):
        if text and draw(st.booleans()):  # a substring of the text: likely to hit
            a = draw(st.integers(0, len(text) - 1))
            stops.append(text[a : a + draw(st.integers(1, 4))])
        else:
            stops.append(draw(st.text(alphabet=CHARS, min_size=1, max_size=3)))
    return text, data, cuts, stops


@settings(max_examples=250, deadline=None)
@given(streams(), st.booleans())
def test_stream_concatenation_equals_final_text_cut_at_first_stop(case, include):
    text, data, cuts, stops = case
    tok = FakeByteTokenizer()
    detok = IncrementalDetokenizer(tok, stop=tuple(stops), include_stop_str_in_output=include)
    deltas, _ = stream(detok, tokenize(tok, data, cuts))
    expected, stop = cut_at_first_stop(text, stops, include)
    assert "".join(deltas) == expected == detok.text
    assert detok.stop_string == stop
    assert not any("\ufffd" in d for d in deltas)
    if not include:
        prefix = ""
        for d in deltas:  # no emitted prefix ever shows a stop string
            prefix += d
            assert not any(s in prefix for s in stops)


def _proper_prefixes_of_characters() -> frozenset[bytes]:
    """Every byte string that begins some character's UTF-8 encoding and is shorter than it."""
    prefixes = set()
    for cp in range(0x80, 0x110000):
        if not 0xD800 <= cp <= 0xDFFF:
            encoded = chr(cp).encode()
            prefixes.update(encoded[:k] for k in range(1, len(encoded)))
    return frozenset(prefixes)


CHARACTER_PREFIXES = _proper_prefixes_of_characters()


def incomplete_tail(data: bytes) -> int:
    """Independent oracle: how many trailing bytes of `data` are an unfinished character (the
    longest tail that is a proper prefix of some character's encoding)."""
    return max(
        (k for k in (1, 2, 3) if len(data) >= k and data[-k:] in CHARACTER_PREFIXES), default=0
    )


def decodable_prefix(data: bytes) -> str:
    """Independent oracle for valid UTF-8: the longest prefix ending on a character boundary."""
    for drop in range(4):
        try:
            return data[: len(data) - drop].decode()
        except UnicodeDecodeError:
            continue
    raise AssertionError("valid UTF-8 has a boundary within the last 4 bytes")


@settings(max_examples=150, deadline=None)
@given(streams())
def test_only_a_possible_stop_prefix_is_held_back(case):
    text, data, cuts, stops = case
    tok = FakeByteTokenizer()
    detok = IncrementalDetokenizer(tok, stop=tuple(stops))
    seen = b""
    for token_id in tokenize(tok, data, cuts):
        detok.add(token_id)
        seen += tok.token_bytes(token_id)
        if detok.stop_string is not None:
            break
        decoded = decodable_prefix(seen)
        # Hold back exactly the longest suffix that is a proper prefix of some stop string.
        held = max((k for s in stops for k in range(len(s)) if decoded.endswith(s[:k])), default=0)
        assert detok.text == decoded[: len(decoded) - held]


@settings(max_examples=200, deadline=None)
@given(
    st.binary(max_size=30),
    st.lists(st.integers(0, 30)),
    st.lists(st.text(alphabet="ab\ufffd", min_size=1, max_size=2), max_size=2),
)
def test_invalid_bytes_decode_like_bytes_decode_with_replace(data, cuts, stops):
    tok = FakeByteTokenizer()
    detok = IncrementalDetokenizer(tok, stop=tuple(stops))
    deltas, _ = stream(detok, tokenize(tok, data, cuts))
    shown = data[: len(data) - incomplete_tail(data)]  # the finish drops a cut character
    expected, stop = cut_at_first_stop(shown.decode("utf-8", errors="replace"), stops, False)
    assert "".join(deltas) == expected
    assert detok.stop_string == stop


@settings(max_examples=150, deadline=None)
@given(streams(), st.integers(0, 12))
def test_stop_strings_arm_only_after_min_tokens(case, min_tokens):
    text, data, cuts, stops = case
    tok = FakeByteTokenizer()
    ids = tokenize(tok, data, cuts)
    # Characters completed by the first `min_tokens` tokens cannot end a stop.
    first_bytes = sum(len(tok.token_bytes(t)) for t in ids[:min_tokens])
    armed_from = len(decodable_prefix(data[:first_bytes]))
    detok = IncrementalDetokenizer(tok, stop=tuple(stops), min_tokens=min_tokens)
    deltas, _ = stream(detok, ids)
    expected, stop = cut_at_first_stop(text, stops, include=False, armed_from=armed_from)
    assert "".join(deltas) == expected
    assert detok.stop_string == stop


@pytest.mark.parametrize("skip", [True, False])
def test_special_tokens_are_skipped_unless_asked(skip):
    tok = FakeByteTokenizer()
    ids = [tok.id_of(b"hi"), FakeByteTokenizer.SPECIAL_ID, tok.id_of(b" there")]
    detok = IncrementalDetokenizer.from_params(tok, SamplingParams(skip_special_tokens=skip))
    deltas, _ = stream(detok, ids)
    assert "".join(deltas) == ("hi there" if skip else "hi<|eot|> there")


def test_stop_string_spanning_a_skipped_special_token_still_matches():
    tok = FakeByteTokenizer()
    ids = [tok.id_of(b"ab"), FakeByteTokenizer.SPECIAL_ID, tok.id_of(b"cd")]
    detok = IncrementalDetokenizer(tok, stop=("bc",))
    deltas, _ = stream(detok, ids)
    assert deltas == ["a", "", "", ""] and detok.stop_string == "bc"


def test_split_multibyte_character_is_emitted_whole_once_complete():
    tok = FakeByteTokenizer()
    euro = "€".encode()  # 3 bytes
    detok = IncrementalDetokenizer(tok)
    deltas, _ = stream(
        detok, [tok.id_of(b"x" + euro[:1]), tok.id_of(euro[1:2]), tok.id_of(euro[2:] + b"y")]
    )
    assert deltas == ["x", "", "€y", ""]


def test_a_dangling_partial_character_is_dropped_at_finish():
    tok = FakeByteTokenizer()
    detok = IncrementalDetokenizer(tok)
    deltas, _ = stream(detok, [tok.id_of(b"ok"), tok.id_of("€".encode()[:2])])
    assert deltas == ["ok", "", ""]


def test_bytes_that_can_never_complete_stay_a_replacement_character():
    tok = FakeByteTokenizer()
    detok = IncrementalDetokenizer(tok)  # "€"'s first two bytes, then a byte that cannot follow
    deltas, _ = stream(detok, [tok.id_of("€".encode()[:2]), tok.id_of(b"x\xe2")])
    assert deltas == ["", "\ufffdx", ""]


def test_add_after_a_stop_is_refused():
    tok = FakeByteTokenizer()
    detok = IncrementalDetokenizer(tok, stop=("b",))
    detok.add(tok.id_of(b"abc"))
    assert detok.stop_string == "b" and detok.text == "a"
    with pytest.raises(ValueError, match="finished"):
        detok.add(tok.id_of(b"d"))


def test_overlapping_stop_completed_after_min_tokens_still_stops():
    # "aa" completes on token 2 (not armed with min_tokens=2) and again, overlapping, on token 3.
    tok = FakeByteTokenizer()
    detok = IncrementalDetokenizer(tok, stop=("aa",), min_tokens=2)
    deltas, _ = stream(detok, [tok.id_of(b"a")] * 4)
    assert "".join(deltas) == "a" and detok.stop_string == "aa"


@pytest.mark.parametrize(
    "data", [b"\xed\xa0", b"a\xed\xbf", b"\xed", b"\xed\x9f", b"\xf4\x8f", b"\xf0\x9f\x98", b"ab"]
)
@pytest.mark.parametrize("stops", [[], ["\ufffd"]])
def test_the_end_of_the_output_decodes_as_the_whole_bytes_do(data, stops):
    # CPython's incremental decoder holds a surrogate's first two bytes (ED A0..BF) as if they
    # could still complete; at the end they are U+FFFD as bytes.decode(errors="replace") makes
    # them, while a real character's unfinished prefix (ED 9F, F4 8F, F0 9F 98) is dropped.
    tok = FakeByteTokenizer()
    detok = IncrementalDetokenizer(tok, stop=tuple(stops))
    deltas, _ = stream(detok, tokenize(tok, data, list(range(len(data)))))
    shown = data[: len(data) - incomplete_tail(data)]
    expected, stop = cut_at_first_stop(shown.decode("utf-8", errors="replace"), stops, False)
    assert "".join(deltas) == expected
    assert detok.stop_string == stop
