"""generation_config.json is read as transformers reads it: on folders whose file sets another
decoder start token, an extra eos id, max_new_tokens, greedy decoding and beam settings, the
engine's request that leaves those unset answers what transformers' `generate` answers with the
file's defaults (T5 and BART, greedy and beam search); a decoder-only folder's sampling keys and
length bound reach its requests too; a request's own values always win; keys tgserve cannot
apply are named."""

from __future__ import annotations

import json

import pytest
import torch

from engine.config import EngineConfig
from engine.engine import Engine
from engine.requests.generation_defaults import GenerationDefaults
from engine.requests.sampling_params import SamplingParams
from tests.devices import selected_device
from tests.encdec_checkpoints import load_hf, save_encdec_checkpoint
from tests.engine.engine_fixtures import tiny_engine

PROMPT = [5, 17, 33, 8, 61, 40, 12, 9, 27]


def _engine(folder) -> Engine:
    config = EngineConfig(
        dtype="float32",
        kv_cache_memory_bytes=2_000_000,
        block_size=4,
        device=str(selected_device()),
    )
    return Engine.from_model(str(folder), config)


def _write(folder, generation: dict) -> None:
    (folder / "generation_config.json").write_text(json.dumps(generation))


def _hf(folder, **kw) -> list[int]:
    with torch.no_grad():
        out = load_hf(folder).generate(torch.tensor([PROMPT]), use_cache=False, **kw)
    return out[0].tolist()


def _until_eos(tokens: list[int], eos: list[int]) -> list[int]:
    """transformers' output after its decoder start token, cut after the first eos."""
    for i, t in enumerate(tokens):
        if t in eos:
            return tokens[: i + 1]
    return tokens


@pytest.mark.parametrize("kind", ["t5v11", "bart"])
def test_an_encoder_decoder_folder_answers_as_generate_with_its_file(kind, tmp_path):
    folder = save_encdec_checkpoint(kind, tmp_path)
    config = json.loads((folder / "config.json").read_text())
    shipped = json.loads((folder / "generation_config.json").read_text())
    start = 7 if config["decoder_start_token_id"] != 7 else 8  # a start config.json does not say
    beams = dict(num_beams=3, length_penalty=0.6, early_stopping=True)
    generation = shipped | dict(decoder_start_token_id=start, max_new_tokens=6, do_sample=False)
    _write(folder, generation | beams)
    free = _hf(folder, num_beams=1)
    assert free[0] == start  # transformers took the file's start token
    # An extra eos id: the third token greedy decoding writes, so that stopping there shows.
    eos = [shipped["eos_token_id"], free[3]] if free[3] != shipped["eos_token_id"] else [free[3]]
    _write(folder, generation | beams | {"eos_token_id": eos})
    greedy_want = _until_eos(_hf(folder, num_beams=1)[1:], eos)
    beam_want = _until_eos(_hf(folder)[1:], eos)  # num_beams 3, lp 0.6, early stopping
    assert len(greedy_want) < 6  # the extra eos ended it
    engine = _engine(folder)
    defaults = engine.info.generation
    assert defaults.ignored == ()
    # What a request leaving everything unset gets: greedy, the file's length bound.
    greedy = SamplingParams(**defaults.fill({}), max_tokens=None)
    assert greedy.temperature == 0.0
    got = engine.generate([PROMPT], greedy)[0].outputs[0]
    assert list(got.token_ids) == greedy_want
    beam = SamplingParams(**defaults.fill({"use_beam_search": True}), max_tokens=None)
    assert (beam.best_of, beam.length_penalty, beam.early_stopping) == (3, 0.6, True)
    got = engine.generate([PROMPT], beam)[0].outputs[0]
    assert list(got.token_ids) == beam_want


def test_a_decoder_only_folder_gives_its_sampling_defaults_and_length_bound(tmp_path):
    tiny_engine(tmp_path)  # writes the llama folder
    _write(tmp_path, {"temperature": 0.6, "top_p": 0.9, "top_k": 20, "max_length": 12})
    engine = tiny_engine(tmp_path)
    params = SamplingParams(
        **engine.info.generation.fill({"seed": 3}), max_tokens=None, ignore_eos=True
    )
    assert (params.temperature, params.top_p, params.top_k) == (0.6, 0.9, 20)
    prompt = list(range(3, 10))  # 7 tokens: max_length 12 leaves 5 new ones
    out = engine.generate([prompt], params)[0].outputs[0]
    assert len(out.token_ids) == 12 - len(prompt)
    spelled = SamplingParams(temperature=0.6, top_p=0.9, top_k=20, seed=3, max_tokens=5)
    assert engine.generate([prompt], spelled)[0].outputs[0].token_ids == out.token_ids


def test_a_request_overrides_the_file_and_unknown_settings_are_named():
    defaults = GenerationDefaults.from_file(
        {
            "temperature": 0.3,
            "repetition_penalty": 1.2,
            "num_beams": 4,
            "length_penalty": 2.0,
            "early_stopping": "never",
            "no_repeat_ngram_size": 3,
            "max_new_tokens": 50,
            "max_length": 9,
        }
    )
    given = {"temperature": 0.9, "repetition_penalty": None, "use_beam_search": None}
    filled = defaults.fill(given)
    assert filled["temperature"] == 0.9 and filled["repetition_penalty"] == 1.2
    assert "best_of" not in filled  # beam search stays opt-in
    wide = defaults.fill({"use_beam_search": True, "n": 2, "best_of": None})
    assert wide["best_of"] == 4 and wide["length_penalty"] == 2.0
    assert defaults.fill({"use_beam_search": True, "best_of": 2})["best_of"] == 2
    assert "early_stopping" not in filled  # "never" is transformers' third mode: not ours
    assert set(defaults.ignored) == {"no_repeat_ngram_size", "early_stopping"}
    assert defaults.max_tokens(decoder_prompt_len=1) == 50  # max_new_tokens before max_length
    assert GenerationDefaults.from_file({"max_length": 9}).max_tokens(4) == 5
    assert GenerationDefaults.from_file({}).max_tokens(4) is None
