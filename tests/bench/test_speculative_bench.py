"""`tgserve bench latency --workload edit --speculative ngram`: the grounded workload is
deterministic and holds what it asks to edit; the latency report adds the speculation counters
of the timed runs (proposed, accepted, per position)."""

from __future__ import annotations

import json

import pytest
import torch

from bench.edit_workload import edit_requests
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
