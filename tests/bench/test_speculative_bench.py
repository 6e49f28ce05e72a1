"""`tgserve bench latency --workload edit --speculative ngram`: the grounded workload is
deterministic and holds what it asks to edit; the latency report adds the speculation counters
of the timed runs (proposed, accepted, per position). `--temperature`: the same prompts, each
request sampled with its own seed (deterministic), run by tgserve and refused by a backend that
decodes greedily."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from bench.backends import BackendOptions, load_backend
from bench.edit_workload import edit_requests
from bench.latency import LatencySpec, latency_requests, run_latency_bench
from bench.model_source import resolve_model
from models.tokenizer import load_tokenizer
from server.cli import main


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: one thread for a 2-layer model
    yield
    torch.set_num_threads(before)


def test_edit_workload_is_deterministic_and_sized(tiny_model_folder):
    tokenizer = load_tokenizer(tiny_model_folder)
    first = edit_requests(4, 120, 16, 3, tokenizer)
    assert first == edit_requests(4, 120, 16, 3, tokenizer)
    assert first != edit_requests(4, 120, 16, 4, tokenizer)
    for request in first:
        assert 60 < len(request.prompt_token_ids) <= 120 and request.output_len == 16
        assert "Passage:" in request.prompt_text
        task, passage = request.prompt_text.split("Passage:")
        quoted = task.split("'")[1::2]  # the word to replace and its replacement
        assert len(quoted) == 2 and any(
            word in passage.replace(".", " ").split() for word in quoted
        )


def test_latency_reports_acceptance_of_the_timed_runs(tiny_model_folder, capsys):
    args = (
        "bench latency --dtype float32 --input-len 96 --output-len 24 --runs 2 --skip-limits "
        "--workload edit --speculative ngram --num-speculative-tokens 3"
    )
    assert main([*args.split(), "--model", str(tiny_model_folder), "--json"]) == 0
    (result,) = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line]
    spec = result["speculation"]
    assert result["workload"] == "edit" and "speculative ngram k=3" in result["note"]
    assert len(spec["proposed_per_position"]) == 3
    assert 0 < spec["num_proposals"] <= 2 * 23  # at most one per decode step of the timed runs
    assert sum(spec["proposed_per_position"]) == spec["num_proposed_tokens"]
    assert sum(spec["accepted_per_position"]) == spec["num_accepted_tokens"]
    assert spec["num_accepted_tokens"] <= spec["num_proposed_tokens"]
    assert main([*args.split(), "--model", str(tiny_model_folder), "--runs", "1"]) == 0
    assert "tgserve speculation (edit prompts):" in capsys.readouterr().out


def test_sampled_latency_requests_are_deterministic_and_seeded(tiny_model_folder):
    source = resolve_model(tiny_model_folder)
    spec = LatencySpec(32, 8, runs=2, warmup_runs=1, seed=5, temperature=1.0)
    first = latency_requests(source, spec)
    assert first == latency_requests(source, spec)
    assert [r.seed for r in first] == [5, 6, 7] and {r.temperature for r in first} == {1.0}
    greedy = latency_requests(source, dataclasses.replace(spec, temperature=0.0))
    assert [r.prompt_token_ids for r in greedy] == [r.prompt_token_ids for r in first]
    assert {(r.seed, r.temperature) for r in greedy} == {(None, 0.0)}
    with pytest.raises(ValueError, match="--temperature"):
        LatencySpec(32, 8, temperature=-1.0)


def test_sampled_latency_runs_seeded_requests_on_tgserve_only(tiny_model_folder, capsys):
    args = (
        "bench latency --dtype float32 --input-len 32 --output-len 12 --runs 1 --skip-limits "
        "--temperature 1 --speculative ngram --clock process"
    )
    assert main([*args.split(), "--model", str(tiny_model_folder)]) == 0
    out = capsys.readouterr().out
    assert "sampled at temperature 1 (seeded)" in out and "tgserve speculation" in out
    assert "timed in process CPU time" in out
    with pytest.raises(ValueError, match="--clock"):
        LatencySpec(32, 8, clock="cycles")
    source = resolve_model(tiny_model_folder)
    spec = LatencySpec(32, 12, runs=1, warmup_runs=0, seed=3, temperature=0.7)
    options = BackendOptions("float32", 4, 256, 1, False, 64, 1)
    with pytest.raises(ValueError, match="--temperature needs"):
        run_latency_bench(["transformers"], source, options, spec, None, False)
    backend = load_backend("tgserve", source, options)
    sent = []
    add = backend.engine.add_request
    backend.engine.add_request = lambda rid, ids, params: (
        sent.append(params) or add(rid, ids, params)
    )
    try:
        (request,) = latency_requests(source, spec)
        backend.run_latency(request)
    finally:
        backend.close()
    assert (sent[0].temperature, sent[0].seed, sent[0].max_tokens) == (0.7, 3, 12)
