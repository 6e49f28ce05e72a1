"""The draft-model proposer: its greedy continuation, verified by the target, returns the tokens
of ordinary decoding (greedy and seeded requests, oracle: the same requests without
speculation); a draft identical to the target has every proposal accepted; its own block
manager stays consistent; a draft with another vocabulary is refused."""

from __future__ import annotations

import pytest

from engine.requests.sampling_params import SamplingParams
from engine.speculative.config import SpeculativeConfig
from tests.checkpoints import save_checkpoint
from tests.devices import skip_cpu_kernels_off_cpu
from tests.engine.engine_fixtures import assert_no_leaks, random_prompts, tiny_engine
from tests.engine.speculative.test_speculative_engine import answers


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("draft")
    target = save_checkpoint("llama", root / "target", seed=0)
    other = save_checkpoint("llama", root / "other", seed=1)  # same shape, other weights
    return target, other


def engine_for(path, **config):
    """On the tests' device, batch-invariant: a verify step scores k + 1 rows where plain
    decoding scores one, and on CUDA only the fixed-tile GEMMs keep a row's bits the same."""
    skip_cpu_kernels_off_cpu(config.get("cpu_kernels", False))
    return tiny_engine(path, batch_invariant=True, **config)


def _draft(path, k: int = 3) -> SpeculativeConfig:
    return SpeculativeConfig(method="draft", num_tokens=k, model=str(path))


PARAMS = [
    SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True, logprobs=1),
    SamplingParams(max_tokens=18, temperature=0.9, top_p=0.9, seed=5, ignore_eos=True),
    SamplingParams(max_tokens=12, temperature=0.0, ignore_eos=True),
]


def test_the_target_as_its_own_draft_has_every_greedy_proposal_accepted(folders):
    target, _ = folders
    prompts = random_prompts(1, (10, 10), seed=1)
    plain = engine_for(target)
    spec = engine_for(target, speculative=_draft(target, k=4))
    params = PARAMS[:1]
    assert answers(spec, prompts, params) == answers(plain, prompts, params)
    stats = spec.stats().speculation
    assert stats.num_proposed_tokens > 0
    assert stats.num_accepted_tokens == stats.num_proposed_tokens  # the same logits, bit for bit
    assert_no_leaks(spec)


@pytest.mark.parametrize("kernels", [False, True], ids=["pytorch", "cpp"])
def test_another_draft_leaves_the_outputs_unchanged(folders, kernels):
    target, other = folders
    prompts = random_prompts(3, (4, 20), seed=2)
    plain = engine_for(target, cpu_kernels=kernels)
    spec = engine_for(target, cpu_kernels=kernels, speculative=_draft(other))
    assert answers(spec, prompts, PARAMS, arrive_every=2) == answers(
        plain, prompts, PARAMS, arrive_every=2
    )
    stats = spec.stats().speculation
    assert stats.num_proposed_tokens > stats.num_accepted_tokens  # a different model: refusals
    spec.speculator.draft.blocks.check_invariants()
    assert_no_leaks(spec)


def test_a_draft_with_another_vocabulary_is_refused(folders, tmp_path):
    target, _ = folders
    small = save_checkpoint("llama", tmp_path / "small-vocab", vocab_size=256)
    with pytest.raises(ValueError, match="speculative_model"):
        engine_for(target, speculative=_draft(small))


def _count_rows(draft) -> list[int]:
    """Records the rows (sequences) of each draft forward."""
    rows: list[int] = []
    execute = draft.runner.execute

    def counting(chunks, *args, **kwargs):
        rows.append(len(chunks))
        return execute(chunks, *args, **kwargs)

    draft.runner.execute = counting
    return rows


def test_alone_the_draft_runs_one_forward_per_proposed_token(folders):
    target, other = folders
    prompts = random_prompts(1, (12, 12), seed=3)
    params = [SamplingParams(max_tokens=20, temperature=0.0, ignore_eos=True)]
    spec = engine_for(target, speculative=_draft(other, k=3))
    rows = _count_rows(spec.speculator.draft)
    assert answers(spec, prompts, params) == answers(engine_for(target), prompts, params)
    stats = spec.stats().speculation
    # no proposal was cut after drafting (the limit reaches the draft), so each drafted token
    # was proposed: as many forwards as proposed tokens, each of one sequence
    assert spec.speculator.draft.num_forwards == len(rows) == stats.num_proposed_tokens
    assert set(rows) == {1}
    assert stats.draft_forwards == len(rows) and stats.draft_seconds > 0  # timed, each one


@pytest.mark.parametrize("kernels", [False, True], ids=["pytorch", "cpp"])
def test_speculating_sequences_draft_together_and_keep_their_tokens(folders, kernels):
    target, other = folders
    k, prompts = 3, random_prompts(4, (5, 16), seed=4)
    params = [
        SamplingParams(max_tokens=30, temperature=0.0, ignore_eos=True),
        SamplingParams(max_tokens=22, temperature=0.8, seed=11, ignore_eos=True),
        SamplingParams(max_tokens=26, temperature=0.7, seed=3, ignore_eos=True, n=2),
        SamplingParams(max_tokens=9, temperature=0.0, ignore_eos=True),
    ]
    plain = engine_for(target, cpu_kernels=kernels)
    spec = engine_for(target, cpu_kernels=kernels, speculative=_draft(other, k=k))
    rows = _count_rows(spec.speculator.draft)
    steps = []
    step = spec.step
    spec.step = lambda: steps.append(1) or step()
    # the oracle: the same requests, same arrivals, decoded without speculation
    assert answers(spec, prompts, params) == answers(plain, prompts, params)
    # 5 sequences decode side by side: their drafts share forwards (one sequence alone would
    # need k forwards for each of its steps, 5 sequences 5 * k)
    assert max(rows) == 5
    assert spec.speculator.draft.num_forwards <= k * len(steps) + 4 * k  # + first proposals
    spec.speculator.draft.blocks.check_invariants()
    assert_no_leaks(spec)
    assert not spec.speculator.draft._mirrors  # finished sequences' draft states are dropped
