"""Stop decisions, hand-worked: EOS, stop token ids, stop strings, max_tokens, min_tokens."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from engine.decoding.detokenizer import IncrementalDetokenizer
from engine.decoding.stop_checker import Finish, StopCriteria, check_stop, finish_after_token
from engine.requests.sampling_params import SamplingParams

EOS = 2
VOCAB = {
    2: b"</s>",
    10: b"Hello",
    11: b" wor",
    12: b"ld",
    13: b"\n",
    14: b"!",
    15: b"\xe2\x82",
    16: b"\xac",
}


class TinyTokenizer:
    def token_bytes(self, token_id: int) -> bytes:
        return VOCAB[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id == EOS


def criteria(**kwargs) -> StopCriteria:
    return StopCriteria.from_params(SamplingParams(**kwargs), eos_token_ids=[EOS])


def run(params: SamplingParams, ids: list[int]) -> tuple[Finish | None, int, str]:
    """Feeds ids like the engine would; returns the finish, the tokens generated, the text."""
    crit = StopCriteria.from_params(params, eos_token_ids=[EOS])
    detok = IncrementalDetokenizer.from_params(TinyTokenizer(), params)
    for k, token_id in enumerate(ids, start=1):
        finish = finish_after_token(crit, detok, token_id, k)
        if finish is not None:
            return finish, k, detok.text
    return None, len(ids), detok.text


def test_eos_stops_with_no_stop_reason():
    assert check_stop(criteria(), EOS, 3) == Finish("stop", None)


def test_ignore_eos_keeps_going_until_length():
    c = criteria(ignore_eos=True, max_tokens=4)
    assert check_stop(c, EOS, 3) is None
    assert check_stop(c, EOS, 4) == Finish("length", None)


def test_stop_token_id_stops_and_names_the_token():
    c = criteria(stop_token_ids=(13, EOS))
    assert check_stop(c, 13, 1) == Finish("stop", 13)
    assert check_stop(c, EOS, 1) == Finish("stop", EOS)  # named explicitly: reported as the id
    assert check_stop(c, 14, 1) is None


def test_max_tokens_gives_length_but_a_natural_stop_on_the_last_token_is_stop():
    c = criteria(max_tokens=3)
    assert check_stop(c, 10, 2) is None
    assert check_stop(c, 10, 3) == Finish("length", None)
    assert check_stop(c, EOS, 3) == Finish("stop", None)
    assert check_stop(c, 10, 3, stop_string="ld") == Finish("stop", "ld")


def test_no_stop_of_any_kind_before_min_tokens():
    c = criteria(min_tokens=2, max_tokens=5, stop_token_ids=(13,))
    for token_id, string in ((EOS, None), (13, None), (10, "x")):
        assert check_stop(c, token_id, 1, string) is None
        assert check_stop(c, token_id, 2, string) is None
        assert check_stop(c, token_id, 3, string) is not None
    assert check_stop(criteria(min_tokens=3, max_tokens=3), EOS, 3) == Finish("length", None)


def test_check_stop_rejects_a_count_that_excludes_the_new_token():
    with pytest.raises(ValueError, match="num_output_tokens"):
        check_stop(criteria(), 10, 0)


def test_stop_string_across_tokens_finishes_and_is_not_in_the_text():
    finish, k, text = run(SamplingParams(stop=("world",)), [10, 11, 12, 14])
    assert (finish, k, text) == (Finish("stop", "world"), 3, "Hello ")


def test_include_stop_str_in_output_keeps_the_stop_string():
    finish, k, text = run(
        SamplingParams(stop=("wor",), include_stop_str_in_output=True), [10, 11, 12]
    )
    assert (finish, k, text) == (Finish("stop", "wor"), 2, "Hello wor")


def test_stop_token_text_is_hidden_unless_included():
    ids = [10, 13, 14]
    assert run(SamplingParams(stop_token_ids=(13,)), ids) == (Finish("stop", 13), 2, "Hello")
    shown = SamplingParams(stop_token_ids=(13,), include_stop_str_in_output=True)
    assert run(shown, ids) == (Finish("stop", 13), 2, "Hello\n")


def test_eos_ends_the_text_without_its_own_text():
    assert run(SamplingParams(skip_special_tokens=False), [10, EOS, 14]) == (
        Finish("stop", None),
        2,
        "Hello",
    )


def test_length_finish_releases_held_back_text_and_drops_dangling_bytes():
    # " wor" could start the stop "world": held back until the length finish releases it; the
    # first two bytes of "€" that end the output are dropped, not shown as U+FFFD.
    finish, k, text = run(SamplingParams(max_tokens=3, stop=("world",)), [10, 11, 15])
    assert (finish, k, text) == (Finish("length", None), 3, "Hello wor")


def test_min_tokens_delays_a_stop_string_to_its_next_occurrence():
    params = SamplingParams(min_tokens=1, stop=("!",))
    assert run(params, [14, 10, 14, 10]) == (Finish("stop", "!"), 3, "!Hello")


def test_split_character_completes_before_a_stop_string_check():
    finish, k, text = run(SamplingParams(stop=("€",)), [10, 15, 16, 14])
    assert (finish, k, text) == (Finish("stop", "€"), 3, "Hello")


class SingleByteTokenizer:
    """Byte fallback at its finest: token i < 256 is the byte i; 256 is EOS."""

    def token_bytes(self, token_id: int) -> bytes:
        return b"</s>" if token_id == 256 else bytes([token_id])

    def is_special(self, token_id: int) -> bool:
        return token_id == 256


def complete_characters(text: str, num_bytes: int) -> str:
    """Oracle: the longest prefix of `text` whose UTF-8 encoding fits in `num_bytes`."""
    out, used = [], 0
    for ch in text:
        used += len(ch.encode())
        if used > num_bytes:
            break
        out.append(ch)
    return "".join(out)


# Valid text only (no lone surrogates), real U+FFFD characters included: those must stay.
TEXTS = st.text(
    alphabet=st.one_of(st.characters(codec="utf-8", exclude_categories=("Cs",)), st.just("\ufffd")),
    min_size=1,
    max_size=12,
)


@settings(max_examples=150, deadline=None)
@given(TEXTS, st.sampled_from(["length", "stop_token", "eos"]))
def test_a_finish_cutting_a_character_drops_its_bytes_at_every_cut(text, ending):
    """The output is the text's bytes as single-byte tokens, ended after k of them for every
    k, by max_tokens or by a stop token / EOS as token k + 1; the final text is the longest
    complete-character prefix and the streamed deltas add up to it."""
    data = text.encode()
    stop_id = 256 if ending == "eos" else 0x7F
    if ending == "stop_token" and stop_id in data:
        data = data.replace(bytes([stop_id]), b"")  # the stop token only where it ends the text
        text = data.decode()
    for k in range(len(data) + 1):
        ids = list(data[:k])
        if ending == "length":
            params = SamplingParams(max_tokens=max(k, 1), ignore_eos=True)
        else:
            ids.append(stop_id)
            stops = (stop_id,) if ending == "stop_token" else ()
            params = SamplingParams(max_tokens=len(ids) + 1, stop_token_ids=stops)
        if not ids:
            continue
        crit = StopCriteria.from_params(params, eos_token_ids=[256])
        detok = IncrementalDetokenizer.from_params(SingleByteTokenizer(), params)
        deltas, finish = [], None
        for n, token_id in enumerate(ids, start=1):
            sent = len(detok.text)
            finish = finish_after_token(crit, detok, token_id, n)
            deltas.append(detok.text[sent:])
            if finish is not None:
                break
        assert finish is not None and n == len(ids)
        assert finish.reason == ("length" if ending == "length" else "stop")
        expected = complete_characters(text, k)
        assert detok.text == "".join(deltas) == expected
        assert detok.text.count("\ufffd") == expected.count("\ufffd")
