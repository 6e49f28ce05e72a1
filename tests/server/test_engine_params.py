"""to_api_error: an engine refusal becomes a 400 that names the API's field once, in the API's
own spelling (the engine's messages open with the engine's field name)."""

from __future__ import annotations

import pytest

from engine import GenerationDefaults, InvalidRequest
from server.engine_params import build_params, to_api_error
from server.errors import ApiError


def test_the_api_name_replaces_the_engine_name_that_opens_the_message() -> None:
    error = to_api_error(
        InvalidRequest("max_tokens", "max_tokens must be at least 1, got 0"),
        {"max_tokens": "max_new_tokens"},
    )
    assert (error.status, error.param) == (400, "max_new_tokens")
    assert error.message == "max_new_tokens must be at least 1, got 0"


def test_a_message_not_opening_with_its_field_is_prefixed_by_it() -> None:
    error = to_api_error(InvalidRequest("prompt", "the prompt holds no token"))
    assert (error.param, error.message) == ("prompt", "prompt: the prompt holds no token")


def test_a_field_name_that_only_prefixes_a_longer_word_is_not_replaced() -> None:
    error = to_api_error(InvalidRequest("n", "needs at least one sequence"))
    assert error.message == "n: needs at least one sequence"


def test_the_real_check_names_its_field_once() -> None:
    with pytest.raises(ApiError) as caught:
        build_params({}, max_tokens=2, min_tokens=5)
    error = caught.value
    assert error.param == "min_tokens"
    assert error.message.startswith("min_tokens ")
    assert error.message.count("min_tokens") == 1, error.message


def test_unset_fields_take_the_model_folders_generation_defaults() -> None:
    from server.openai.params import chat_params, completion_params
    from server.openai.protocol import ChatCompletionRequest, CompletionRequest

    defaults = GenerationDefaults.from_file(
        {"do_sample": False, "repetition_penalty": 1.3, "num_beams": 3, "length_penalty": 0.5}
    )
    messages = [{"role": "user", "content": "hi"}]
    plain = chat_params(ChatCompletionRequest(model="m", messages=messages), defaults=defaults)
    assert (plain.temperature, plain.repetition_penalty) == (0.0, 1.3)
    assert not plain.use_beam_search  # beam search stays the request's choice
    beams = completion_params(
        CompletionRequest(model="m", prompt="x", use_beam_search=True), defaults=defaults
    )
    assert (beams.best_of, beams.length_penalty) == (3, 0.5)
    own = completion_params(
        CompletionRequest(model="m", prompt="x", temperature=0.8, repetition_penalty=1.0),
        defaults=defaults,
    )
    assert (own.temperature, own.repetition_penalty) == (0.8, 1.0)  # the request's own values
    assert completion_params(CompletionRequest(model="m", prompt="x")).temperature == 1.0


@pytest.mark.parametrize("temperature", [0, 0.0, 1e-6, 1e-38])
def test_greedy_n_runs_one_sequence_under_the_engines_greedy_floor(temperature) -> None:
    """Below GREEDY_BELOW_TEMPERATURE the engine decodes greedily, so n > 1 there is the one
    greedy sequence copied: the server's rule and the engine's agree (were they to differ,
    1e-6 with n=3 would be the engine's 400 on `n`)."""
    params = build_params({}, max_tokens=4, temperature=temperature, n=3)
    assert params.n == 1 and params.greedy


def test_n_above_the_greedy_floor_samples_n_sequences() -> None:
    params = build_params({}, max_tokens=4, temperature=1e-5, n=3)
    assert params.n == 3 and not params.greedy
