"""`--backend tgserve-baseline --baseline-tree PATH`: another checkout, run in a subprocess.

This checkout as its own baseline must do exactly the work the in-process tgserve backend does;
a fake tree in the earlier `server/bench/` layout (standard library only, so no model loads)
checks the layout fallback, the option filtering and the plain-data round trip; bad trees and
flags fail with a message naming what to fix. The real previous build (a `git worktree add` of an
earlier commit, which compiles its own C++ kernels) is too slow for CI: that check is by hand.
"""

from __future__ import annotations

import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.backends import BackendOptions, BackendUnavailable, load_backend
from bench.model_source import resolve_model
from bench.workload import BenchRequest, WorkloadSpec, make_workload
from server.cli import main
from tests.checkpoints import VOCAB, save_checkpoint

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    return save_checkpoint("llama", tmp_path_factory.mktemp("baseline") / "tiny-llama", seed=0)


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the worker is told the same count
    yield
    torch.set_num_threads(before)


def _options(tree: Path | None, **changes) -> BackendOptions:
    options = BackendOptions("float32", 4, 64, 4, False, 64, 6, baseline_tree=tree and str(tree))
    return replace(options, **changes)


def test_this_checkout_as_baseline_decodes_what_the_in_process_backend_decodes(tiny_model):
    source = resolve_model(tiny_model)
    requests = make_workload(WorkloadSpec(5, 9, 4, "uniform", seed=1), VOCAB)
    results = {}
    for name in ("tgserve", "tgserve-baseline"):
        # PyTorch paths: a cold C++ kernel build (a minute) in either process would swamp the test.
        # No step-time target: it sizes steps from their timings, so the two processes' KV
        # peaks could differ; without it both schedule the same steps.
        options = _options(REPO, cpu_kernels=False, target_itl_ms=0)
        backend = load_backend(name, source, options)
        try:
            progress: list[int] = []
            results[name] = (
                backend.run_latency(requests[0]),
                backend.run_throughput(requests, progress.append),
                progress,
                backend.name,
                backend.note,
            )
        finally:
            backend.close()
    (lat, thr, progress, _, note), (b_lat, b_thr, b_progress, b_name, b_note) = results.values()
    assert (b_lat.prompt_tokens, b_lat.output_tokens) == (lat.prompt_tokens, lat.output_tokens)
    assert b_lat.prefill_s > 0 and b_lat.decode_s > 0
    assert (b_thr.num_requests, b_thr.prompt_tokens, b_thr.output_tokens) == (
        thr.num_requests,
        thr.prompt_tokens,
        thr.output_tokens,
    )
    assert b_thr.output_tokens == sum(r.output_len for r in requests)
    assert b_thr.kv_cache == thr.kv_cache  # rebuilt from plain data: the same figures
    assert b_progress == progress == [1, 2, 3, 4, 5]
    assert b_name.startswith("tgserve@") and b_note.startswith(note)


def test_a_missing_tree_or_one_without_tgserve_is_unavailable_with_the_reason(tiny_model, tmp_path):
    source = resolve_model(tiny_model)
    with pytest.raises(BackendUnavailable, match="no such folder"):
        load_backend("tgserve-baseline", source, _options(tmp_path / "missing"))
    (tmp_path / "empty").mkdir()
    with pytest.raises(BackendUnavailable, match="holds no tgserve bench backend"):
        load_backend("tgserve-baseline", source, _options(tmp_path / "empty"))
    with pytest.raises(ValueError, match="--baseline-tree PATH"):
        load_backend("tgserve-baseline", source, _options(None))


@pytest.mark.parametrize("flags", [["--backend", "tgserve-baseline"], ["--baseline-tree", "."]])
def test_the_backend_and_its_tree_flag_go_together(flags, capsys):
    argv = ["bench", "latency", "--model", "missing", "--skip-limits", *flags]
    assert main(argv) == 2
    assert "--baseline-tree PATH go together" in capsys.readouterr().err


# An earlier layout: server/bench/, fewer BackendOptions fields, KV figures of another shape.
FAKE_OLD_TREE = {
    "engine/__init__.py": "",
    "server/__init__.py": "",
    "server/bench/__init__.py": "",
    "server/bench/backends.py": """
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class BackendOptions:
            dtype: str
            max_num_seqs: int
            max_num_batched_tokens: int
            hf_batch_size: int
            enable_prefix_caching: bool
            max_model_len: int
            num_requests: int
    """,
    "server/bench/workload.py": """
        from dataclasses import dataclass

        @dataclass(frozen=True)
        class BenchRequest:
            prompt_token_ids: tuple
            output_len: int
    """,
    "server/bench/model_source.py": """
        def resolve_model(path):
            return path
    """,
    "server/bench/backend_tgserve.py": """
        from dataclasses import dataclass
        from types import SimpleNamespace

        @dataclass(frozen=True)
        class Figures:
            bytes_per_token: int

        class Backend:
            name = "tgserve"

            def __init__(self, source, options):
                self.note = f"old layout, {source.split('/')[-1]}, max_num_seqs {options.max_num_seqs}"

            def run_latency(self, r):
                return SimpleNamespace(
                    prompt_tokens=len(r.prompt_token_ids), output_tokens=r.output_len,
                    prefill_s=0.5, decode_s=0.25,
                )

            def run_throughput(self, requests, on_finished):
                for n in range(1, len(requests) + 1):
                    on_finished(n)
                return SimpleNamespace(
                    num_requests=len(requests),
                    prompt_tokens=sum(len(r.prompt_token_ids) for r in requests),
                    output_tokens=sum(r.output_len for r in requests),
                    elapsed_s=1.5, kv_cache=Figures(512),
                )

            def close(self):
                print("closed")  # stdout of the tree must not break the protocol

        def load(source, options):
            print("loading")
            return Backend(source, options)
    """,
}


def test_a_tree_in_the_earlier_layout_gets_its_own_options_and_requests(
    tiny_model, tmp_path, capfd
):
    tree = tmp_path / "old"
    for rel, text in FAKE_OLD_TREE.items():
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(textwrap.dedent(text))
    source = resolve_model(tiny_model)
    options = _options(tree, max_num_seqs=3, quantization="int8")
    backend = load_backend("tgserve-baseline", source, options)
    try:
        assert backend.name == "tgserve@old"  # no git checkout: the folder's name
        assert backend.note == f"old layout, tiny-llama, max_num_seqs 3; tree {tree.resolve()}"
        latency = backend.run_latency(BenchRequest((1, 2, 3), 4))
        assert (latency.prompt_tokens, latency.output_tokens, latency.prefill_s) == (3, 4, 0.5)
        progress: list[int] = []
        sample = backend.run_throughput([BenchRequest((1, 2), 3)] * 2, progress.append)
        assert (sample.num_requests, sample.prompt_tokens, sample.output_tokens) == (2, 4, 6)
        assert progress == [1, 2] and sample.kv_cache is None  # figures of another shape: dropped
    finally:
        backend.close()
    err = capfd.readouterr().err
    assert "no option for quantization='int8'" in err and "loading" in err and "closed" in err
    assert sys.modules.get("server.bench") is None  # the old layout never entered this process


def test_an_earlier_trees_none_takes_the_spellings_later_trees_gave_it() -> None:
    from dataclasses import dataclass, fields

    from bench.backends.tree_worker import _tree_value

    @dataclass(frozen=True)
    class Earlier:  # cd83ed6's field: None (float, its default) or "int8"
        activation_quantization: str | None = None
        dtype: str = "auto"

    earlier = {f.name: f for f in fields(Earlier)}
    later = {f.name: f for f in fields(BackendOptions)}  # this tree's: "auto" by default
    for value, want in (("auto", None), ("none", None), ("int8", "int8"), ("int16", "int16")):
        assert _tree_value(earlier["activation_quantization"], value) == want
    assert _tree_value(later["activation_quantization"], "none") == "none"  # a tree that knows it
    assert _tree_value(earlier["dtype"], "auto") == "auto"  # only the field that changed
