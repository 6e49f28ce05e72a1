"""LoRA adapters through the engine (tiny llama, float32, C++ CPU step): requests of four
adapters and of the base model staggered into shared steps return their solo runs' tokens and
logprobs bit for bit, and peft's greedy tokens; a prefix-cache hit never crosses adapters;
--max-loras slots are reused least recently used first, never from under a request in flight;
an adapter's weights are held once, whatever the number of requests."""

from __future__ import annotations

import pytest
import torch

from engine.errors import InvalidRequest
from engine.lora_adapters import AdapterInUse, AdapterSlotsBusy
from engine.lora_config import LoraConfig
from engine.requests.sampling_params import SamplingParams
from tests.checkpoints import make_hf_model, save_checkpoint
from tests.engine.engine_fixtures import assert_no_leaks, random_prompts, run_staggered, tiny_engine
from tests.models.lora.peft_adapters import make_peft_adapter

pytestmark = pytest.mark.cpu_kernels


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora_engine")
    save_checkpoint("llama", folder / "base")
    hf = make_hf_model("llama")
    peft = {f"a{i}": make_peft_adapter(hf, folder / f"a{i}", seed=30 + i) for i in range(4)}
    return folder, peft


def engine_with(folder, names, **kw):
    adapters = tuple((n, str(folder / n)) for n in names)
    return tiny_engine(folder / "base", lora=LoraConfig(adapters=adapters, **kw))


def greedy(adapter: str | None, max_tokens: int = 6) -> SamplingParams:
    return SamplingParams(
        max_tokens=max_tokens, temperature=0.0, ignore_eos=True, logprobs=2, adapter=adapter
    )


def result(final):
    out = final.outputs[0]
    return out.token_ids, [(e.token_id, e.logprob) for e in out.logprobs]


def test_mixed_adapters_equal_solo_runs_and_peft(setup) -> None:
    folder, peft = setup
    names = [None, "a0", "a1", "a2", "a3", "a1", None, "a3"]
    shared = random_prompts(1, (9, 9), seed=4)[0]
    prompts = [shared + p for p in random_prompts(len(names), (3, 12), seed=5)]
    params = [greedy(n) for n in names]
    engine = engine_with(folder, list(peft), max_loras=4)
    together = run_staggered(engine, prompts, params, arrive_every=1)
    assert_no_leaks(engine)
    for i, name in enumerate(names):
        solo = run_staggered(
            engine_with(folder, list(peft), max_loras=4), [prompts[i]], [params[i]]
        )
        assert result(together[i]) == result(solo[0]), f"request {i} ({name}) differs alone"
    for i in (1, 2):  # peft's own greedy continuation
        prompt = torch.tensor([prompts[i]])
        with torch.no_grad():
            want = peft[names[i]].generate(
                prompt, max_new_tokens=6, do_sample=False, pad_token_id=0
            )
        assert list(together[i].outputs[0].token_ids) == want[0, len(prompts[i]) :].tolist()


def test_prefix_cache_hits_never_cross_adapters(setup) -> None:
    folder, peft = setup
    engine = engine_with(folder, ["a0", "a1"])
    prompt = random_prompts(1, (21, 21), seed=6)[0]
    outs = {}
    for rid, name in enumerate(["a0", None, "a1", "a0"]):
        engine.add_request(str(rid), prompt, greedy(name, 3))
        while engine.has_unfinished_requests():
            engine.step()
        outs[rid] = engine.stats().prefix_cache_hits
    # Only the second a0 request finds blocks (5 full blocks of 4 tokens); the base model's
    # and a1's would be a0's K/V, which their projections do not produce.
    assert [outs[0], outs[1], outs[2], outs[3]] == [0, 0, 0, 20]


def test_slots_are_reused_lru_never_from_under_a_request(setup) -> None:
    folder, peft = setup
    engine = engine_with(folder, ["a0", "a1", "a2"], max_loras=2)
    bank = engine.runner.model.lora_bank
    pointers = [t.data_ptr() for s in bank.stacks() for t in (s.a, s.b)]
    prompt = random_prompts(1, (6, 6), seed=7)[0]
    alone = {
        n: result(run_staggered(engine_with(folder, [n]), [prompt], [greedy(n)])[0])
        for n in ("a0", "a2")
    }
    engine.add_request("x", prompt, greedy("a0", 30))
    engine.add_request("y", prompt, greedy("a1", 30))
    engine.step()
    with pytest.raises(AdapterSlotsBusy, match="all 2 LoRA adapter slots"):
        engine.add_request("z", prompt, greedy("a2"))
    with pytest.raises(AdapterInUse, match="in use by 1 request"):
        engine.intake.adapters.unregister("a0")
    while engine.has_unfinished_requests():
        engine.step()
    # Both slots free again: a2 takes the least recently used one (a0's), a0 then comes back.
    for name in ("a2", "a0"):
        final = run_staggered(engine, [prompt], [greedy(name)])[0]
        assert result(final) == alone[name]
    assert_no_leaks(engine)
    assert [t.data_ptr() for s in bank.stacks() for t in (s.a, s.b)] == pointers  # in place
    engine.intake.adapters.unregister("a1")
    with pytest.raises(InvalidRequest, match="'a1' is not a LoRA adapter being served"):
        engine.add_request("w", prompt, greedy("a1"))


def test_an_adapters_bytes_are_held_once(setup) -> None:
    folder, peft = setup
    engine = engine_with(folder, ["a0"], max_loras=1, max_lora_rank=4)
    bank = engine.runner.model.lora_bank
    # tiny llama, rank 4: per layer A (3 + 1 + 2) x 4 x 96 + 4 x 112, B (96 + 32 + 32 + 96 +
    # 224 + 96) x 4, scales (96 + 32 + 32 + 96 + 224 + 96) floats; 2 layers, float32
    per_layer = (6 * 4 * 96 + 4 * 112) + 576 * 4 + 576
    assert bank.nbytes == 2 * per_layer * 4
    loads = []
    adapters = engine.intake.adapters
    load = adapters._load
    adapters._load = lambda *a: (loads.append(a[1]), load(*a))
    prompts = random_prompts(8, (4, 9), seed=8)
    run_staggered(engine, prompts, [greedy("a0")] * 8, arrive_every=0)
    assert loads == ["a0"]  # one copy into the bank for eight requests
    assert bank.nbytes == 2 * per_layer * 4
