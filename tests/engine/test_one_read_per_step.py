"""One device-to-host read per step (issue 38): sampling, beam candidates, speculative
acceptance and prompt logprobs run below the runner and come back in ONE `fetch`.

A tiny engine with n-gram speculation serves greedy, seeded sampled (with logprobs), n > 1,
plain and sampled beam search, prompt-logprob and speculated requests together. Every step's
sampling (the runner floor's `StepSampler.sample_step`) is recorded with the recorder of
test_host_syncs.py: no read of device data outside `fetch` (`.tolist()`, `.item()`,
data-dependent shapes...), and exactly one `fetch`, however the step's rows mix. The sampler
runs its device-side variants (`device_side`, what an accelerator runs). Above the runner no
module imports torch (test_torch_floor.py), so nothing else in the step can read the device.
The requests' answers are also checked against the same engine's runs without the recorder.
"""

from __future__ import annotations

import pytest

from engine.requests.sampling_params import SamplingParams
from engine.speculative.config import SpeculativeConfig
from tests.engine.engine_fixtures import run_staggered, tiny_engine
from tests.engine.test_host_syncs import recording

MOTIF = [5, 9, 14, 5, 9, 14, 5, 9, 14, 5, 9]  # repetitive: the n-gram proposer proposes
REQUESTS = {
    "greedy": SamplingParams(max_tokens=6, temperature=0.0, ignore_eos=True),
    "sampled": SamplingParams(max_tokens=6, temperature=0.8, seed=3, logprobs=2, ignore_eos=True),
    "n=2": SamplingParams(max_tokens=5, temperature=1.0, n=2, seed=4, ignore_eos=True),
    "beam": SamplingParams(max_tokens=5, temperature=0.0, use_beam_search=True, n=2, best_of=3),
    "beam sampling": SamplingParams(
        max_tokens=5, temperature=0.9, use_beam_search=True, n=2, seed=6, logprobs=1
    ),
    "prompt logprobs": SamplingParams(
        max_tokens=4, temperature=0.0, prompt_logprobs=2, ignore_eos=True
    ),
    "speculated": SamplingParams(max_tokens=10, temperature=0.0, ignore_eos=True),
    "speculated seeded": SamplingParams(max_tokens=10, temperature=0.7, seed=9, ignore_eos=True),
}


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("tiny-llama-one-read")


def _engine(folder):
    engine = tiny_engine(folder, speculative=SpeculativeConfig(num_tokens=3), cpu_kernels=False)
    engine.runner.step_sampler.sampler.device_side = True  # the accelerator's variants
    return engine


def _answers(finals) -> list:
    return [
        [(c.token_ids, c.logprobs, c.finish_reason) for c in finals[i].outputs]
        for i in sorted(finals)
    ]


def test_every_step_reads_the_device_once(folder, monkeypatch) -> None:
    prompts = [MOTIF[: 6 + i] for i in range(len(REQUESTS))]
    params = list(REQUESTS.values())
    want = _answers(run_staggered(_engine(folder), prompts, params, arrive_every=0))
    engine = _engine(folder)
    sampler = engine.runner.step_sampler
    sample_step = sampler.sample_step
    steps: list[tuple[int, list[str]]] = []  # (fetches, syncs) per step

    def recorded(logits, all_rows, sampling):
        with pytest.MonkeyPatch.context() as patch, recording(patch) as rec:
            out = sample_step(logits, all_rows, sampling)
        steps.append((rec.fetches, rec.syncs))
        return out

    monkeypatch.setattr(sampler, "sample_step", recorded)
    got = _answers(run_staggered(engine, prompts, params, arrive_every=0))
    assert got == want and all(c[2] != "error" for answer in got for c in answer)
    assert engine.stats().speculation.num_proposed_tokens > 0  # speculated steps were recorded
    assert steps and all(syncs == [] for _, syncs in steps), steps
    assert [fetches for fetches, _ in steps] == [1] * len(steps)
