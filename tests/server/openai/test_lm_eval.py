"""lm-evaluation-harness against a live server, with the README's recipe (the `eval` extra).

Two tiny tasks made in the test (local JSON, no download) run through `python -m lm_eval`:
a multiple-choice task through `local-completions` (log-likelihoods from /v1/completions with
`echo` and `logprobs`) and a generation task through `local-chat-completions`. Oracles:
transformers' log-probabilities of each choice on the same tiny random Llama, and the server's
own greedy chat answer for the generated text. Skipped, with the reason, where lm_eval is not
installed (`pip install -e '.[eval]'`).
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import httpx
import pytest
import torch

from engine import Engine, EngineConfig
from tests.server.live import LiveServer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("lm_eval") is None,
    reason="lm_eval is not installed: pip install -e '.[eval]'",
)
QUESTIONS = [
    {"question": "The quick brown fox", "choices": [" jumps", " sleeps", " runs"], "answer": 0},
    {"question": "Hello world! How are", "choices": [" you", " they"], "answer": 0},
]
TASK = """
task: {name}
dataset_path: json
dataset_kwargs: {{data_files: {{test: "{data}"}}}}
test_split: test
doc_to_text: "{{{{question}}}}"
"""
TASKS = {  # what each task adds to TASK
    "tgserve_tiny_choice": """
output_type: multiple_choice
doc_to_choice: "{{choices}}"
doc_to_target: "{{answer}}"
target_delimiter: ""
metric_list: [{metric: acc}]
""",
    "tgserve_tiny_generation": """
output_type: generate_until
doc_to_target: "{{choices[0]}}"
generation_kwargs: {until: ["<|im_end|>"], max_gen_toks: 6, do_sample: false, temperature: 0}
metric_list: [{metric: exact_match}]
""",
}


@pytest.fixture(scope="module")
def server(tiny_model_folder):
    config = EngineConfig(dtype="float32", kv_cache_memory_bytes=4_000_000, block_size=4)
    with LiveServer(lambda: Engine.from_model(str(tiny_model_folder), config)) as live:
        yield live


def run_lm_eval(tmp_path: Path, model: str, model_args: str, task: str, *extra: str) -> dict:
    """`python -m lm_eval` on one local task; returns its logged samples by document id."""
    data = tmp_path / "questions.jsonl"
    data.write_text("".join(json.dumps(q) + "\n" for q in QUESTIONS))
    tasks = tmp_path / "tasks"
    tasks.mkdir(exist_ok=True)
    (tasks / f"{task}.yaml").write_text(TASK.format(name=task, data=data) + TASKS[task])
    command = [
        sys.executable, "-m", "lm_eval", "--model", model, "--model_args", model_args,
        "--tasks", task, "--include_path", str(tasks), "--output_path", str(tmp_path / "out"),
        "--log_samples", *extra,
    ]  # fmt: skip
    env = {**os.environ, "HF_DATASETS_OFFLINE": "1", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run(command, capture_output=True, text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    (samples,) = (tmp_path / "out").rglob(f"samples_{task}_*.jsonl")
    rows = [json.loads(line) for line in samples.read_text().splitlines()]
    return {row["doc_id"]: row for row in rows}


def hf_loglikelihood(folder: Path, context: str, continuation: str) -> float:
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(folder)
    model = transformers.LlamaForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    whole = tokenizer(context + continuation)["input_ids"]
    start = len(tokenizer(context)["input_ids"])
    with torch.no_grad():
        logprobs = model(torch.tensor([whole])).logits[0].log_softmax(-1)
    return sum(logprobs[i - 1, whole[i]].item() for i in range(start, len(whole)))


def test_local_completions_scores_choices_with_the_models_loglikelihoods(
    server, tiny_model_folder, tmp_path
):
    model = server.state.model_names[0]
    args = (
        f"model={model},base_url={server.url}/v1/completions,tokenizer={tiny_model_folder},"
        "tokenizer_backend=huggingface,num_concurrent=1,max_retries=1"
    )
    samples = run_lm_eval(tmp_path, "local-completions", args, "tgserve_tiny_choice")
    assert sorted(samples) == list(range(len(QUESTIONS)))
    for doc_id, question in enumerate(QUESTIONS):
        scores = [float(resp[0][0]) for resp in samples[doc_id]["resps"]]  # logged as text
        expected = [
            hf_loglikelihood(tiny_model_folder, question["question"], choice)
            for choice in question["choices"]
        ]
        assert scores == pytest.approx(expected, abs=1e-3), question


def test_local_chat_completions_generates_the_servers_greedy_answer(server, tmp_path):
    model = server.state.model_names[0]
    args = f"model={model},base_url={server.url}/v1/chat/completions,num_concurrent=1"
    samples = run_lm_eval(
        tmp_path, "local-chat-completions", args, "tgserve_tiny_generation", "--apply_chat_template"
    )
    for doc_id, question in enumerate(QUESTIONS):
        body = {
            "messages": [{"role": "user", "content": question["question"]}],
            "max_tokens": 6,
            "temperature": 0,
            "stop": ["<|im_end|>"],
        }
        answer = httpx.post(server.url + "/v1/chat/completions", json=body, timeout=60).json()
        expected = answer["choices"][0]["message"]["content"]
        assert samples[doc_id]["resps"][0][0] == expected, question
