"""One runner contract (engine/runner.py): every runner the engine can step through offers the
whole `Runner` Protocol as its own methods (no stub class fields standing in for it), and the
two model runners share one `execute` skeleton (neither carries a copy of it). The fake-device
runner's outputs follow its contract (hand-worked greedy cycle)."""

from __future__ import annotations

import pytest

from engine import fake_device_engine
from engine.encdec_runner import EncoderDecoderRunner
from engine.fake_device import FakeDeviceRunner
from engine.model_runner import ModelRunner
from engine.requests.sampling_params import SamplingParams
from engine.runner import Runner, StepRunner

RUNNERS = [ModelRunner, EncoderDecoderRunner, FakeDeviceRunner]
# what every instance sets in __init__ (a Protocol's data members have no class value)
INSTANCE_FACTS = {"config", "device", "forward_path"}


def _contract() -> set[str]:
    names = {n for n in vars(Runner) if not n.startswith("_")}
    return names | set(Runner.__annotations__)


@pytest.mark.parametrize("cls", RUNNERS, ids=lambda c: c.__name__)
def test_every_runner_offers_the_whole_contract(cls):
    assert {"execute", "describe", "between_requests", "close", "vocab_size"} <= _contract()
    missing = [n for n in sorted(_contract() - INSTANCE_FACTS) if not hasattr(cls, n)]
    assert missing == []
    stubs = [n for n, v in vars(cls).items() if not n.startswith("__") and v is None]
    assert stubs == [], "class fields set to None fake the contract"


@pytest.mark.parametrize("cls", [ModelRunner, EncoderDecoderRunner], ids=lambda c: c.__name__)
def test_the_model_runners_share_one_execute_skeleton(cls):
    assert issubclass(cls, StepRunner)
    assert cls.execute is StepRunner.execute and cls.run is StepRunner.run


def test_the_fake_device_decodes_its_documented_cycle():
    """Step k's row r picks (7k + r) % vocab: one request's greedy tokens are 0, 7, 14, ..."""
    engine = fake_device_engine(0.0, vocab_size=10)
    try:
        out = engine.generate([[1, 2, 3]], SamplingParams(max_tokens=4, temperature=0.0))
    finally:
        engine.close()
    assert list(out[0].outputs[0].token_ids) == [0, 7, 4, 1]
