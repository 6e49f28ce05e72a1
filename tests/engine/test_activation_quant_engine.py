"""The engine with `activation_quantization="int8"` (and "int16") on the default model (Q4_1
layers, a Q8_0 tied LM head): every linear runs integer activations inside the C++ step, a greedy
request returns the tokens and logprobs of its solo run while other requests come and go, int16
answers the float engine's greedy tokens, and the option is refused, naming itself, where it
has nothing to run."""

from __future__ import annotations

import pytest

from engine import Engine, EngineConfig, SamplingParams
from models import cpu_kernels
from models.activation_quant import Q8Linear
from tests.devices import default_model_here
from tests.engine.engine_fixtures import assert_no_leaks, run_staggered

pytestmark = pytest.mark.skipif(
    not cpu_kernels.is_available(), reason="tgserve's C++ CPU kernels did not build here"
)
PROMPTS = [
    "<|im_start|>user\nWhat is the capital of France?<|im_end|>\n<|im_start|>assistant\n",
    "The three primary colours are",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
    "Water boils at",
]


@pytest.fixture(
    scope="module", params=[("float32", "int8"), ("bfloat16", "int8"), ("float32", "int16")]
)
def engine(request) -> Engine:
    dtype, activations = request.param
    config = EngineConfig(
        max_model_len=256,
        dtype=dtype,
        activation_quantization=activations,
        max_num_seqs=8,
        device="cpu",  # int8 activations are a CPU path (VNNI), whatever device the tests use
    )
    return Engine.from_model(str(default_model_here()), config)


def test_every_linear_runs_int8_activations_in_the_cpp_step(engine: Engine) -> None:
    model = engine.runner.model
    linears = [m for m in model.modules() if hasattr(m, "in_features")]
    assert linears and all(isinstance(m, Q8Linear) for m in linears)
    bits = 16 if engine.config.activation_quantization == "int16" else 8
    assert all(m.q8_weight.act_bits == bits for m in linears)
    described = engine.describe()
    assert described.cpu_kernels
    q8_bytes = sum(m.q8_weight.nbytes for m in linears)  # counted as weights held
    assert described.held_bytes["weights"] >= q8_bytes


def test_greedy_requests_equal_their_solo_runs_beside_traffic(engine: Engine) -> None:
    params = [
        SamplingParams(max_tokens=12 + 3 * i, temperature=0.0, logprobs=2, ignore_eos=True)
        for i in range(len(PROMPTS))
    ]
    prompts = [engine.tokenizer.encode(p) for p in PROMPTS]
    solo = [engine.generate([p], q)[0].outputs[0] for p, q in zip(prompts, params, strict=True)]
    together = run_staggered(engine, prompts, params, arrive_every=2)
    for i, alone in enumerate(solo):
        got = together[i].outputs[0]
        assert got.token_ids == alone.token_ids, i
        assert got.logprobs == alone.logprobs, i
    assert_no_leaks(engine)
    assert "Paris" in solo[0].text  # the quantised model still knows


def _default_model_engine(activations: str) -> Engine:
    config = EngineConfig(
        max_model_len=256,
        dtype="float32",
        activation_quantization=activations,
        max_num_seqs=8,
        device="cpu",
    )
    return Engine.from_model(str(default_model_here()), config)


def test_int16_answers_the_float_engines_greedy_tokens() -> None:
    """int16's promise (models/activation_quant.py): float-like products, so the float engine's
    greedy tokens on the default model, the chat question's answer among them. (int8 promises
    only its solo run's tokens: the fixture's int8 engines are not asked this.)"""
    int16_engine, float_engine = _default_model_engine("int16"), _default_model_engine("none")
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = [int16_engine.tokenizer.encode(p) for p in PROMPTS]
    assert not any(isinstance(m, Q8Linear) for m in float_engine.runner.model.modules())
    assert all(
        m.q8_weight.act_bits == 16
        for m in int16_engine.runner.model.modules()
        if isinstance(m, Q8Linear)
    )
    want = [o.outputs[0].token_ids for o in float_engine.generate(prompts, params)]
    got = [o.outputs[0].token_ids for o in int16_engine.generate(prompts, params)]
    assert got == want
    assert "Paris" in int16_engine.tokenizer.decode(got[0])


def test_config_refuses_an_unknown_activation_quantization() -> None:
    with pytest.raises(
        ValueError, match="activation_quantization must be 'auto', 'int8', 'int16' or None"
    ):
        EngineConfig(activation_quantization="int4")
    with pytest.raises(ValueError, match="activation_quantization"):
        EngineConfig(activation_quantization="int8", tensor_parallel_size=2)


def test_dequantized_weights_leave_it_nothing_to_run() -> None:
    config = EngineConfig(
        max_model_len=64, activation_quantization="int8", dequantize=True, device="cpu"
    )
    with pytest.raises(ValueError, match="activation_quantization 'int8' found no layer"):
        Engine.from_model(str(default_model_here()), config)
