"""Decode steps through the graph machinery (persistent buffers, bucket padding, one recorded
forward per bucket) give the real rows exactly what the eager step gives, and padding writes
into no live KV block. The path is the capturable one (the Triton path): on CUDA its graphs are
captured; on CPU its kernels run in Triton's interpreter and a "graph" re-runs the recorded
function over the same buffers (engine/cuda_graphs/decode_graphs.py `EagerReplay`)."""

from __future__ import annotations

import pytest
import torch

from engine import model_runner
from engine.cuda_graphs.decode_graphs import GraphSettings, graphs_supported
from engine.model_runner import ModelRunner
from models import build_model
from models.config import ModelConfig
from models.forward_path import TritonPath
from models.linear_backend import use_invariant_linears
from tests.checkpoints import make_hf_model
from tests.engine.test_model_runner import _Chunk, _Seq

NUM_BLOCKS, BLOCK_SIZE = 24, 4


def _triton_path(model, kv_caches, device, *, cpu_kernels, batch_invariant=False):
    """On CPU: the Triton path (interpreted), its linears batch-invariant as the CPU paths'
    are (whatever `batch_invariant` says), so a step padded to its bucket compares bit for bit
    with the unpadded one."""
    use_invariant_linears(model)
    return TritonPath(model, kv_caches)


@pytest.fixture
def capturable(monkeypatch, device) -> torch.device:
    """The device, with the capturable path on it (chosen by the seam itself on CUDA)."""
    if device.type == "cpu":
        monkeypatch.setattr(model_runner, "select_forward_path", _triton_path)
    return device


def _runner(
    arch: str, graphs: GraphSettings | None, device: torch.device | str = "cpu"
) -> ModelRunner:
    hf = make_hf_model(arch)
    config = ModelConfig.from_hf_dict(hf.config.to_dict())
    model = build_model(config, torch.float32, device)
    model.load_weights(hf.state_dict().items())
    device = torch.device(device)
    return ModelRunner(model, config, NUM_BLOCKS, BLOCK_SIZE, torch.float32, device, graphs=graphs)


def _graph_runner(arch: str, graphs: GraphSettings, device: torch.device) -> ModelRunner:
    runner = _runner(arch, graphs, device)
    assert runner.decode_graphs is not None  # the Triton path's decode steps are capturable
    assert runner.decode_graphs.captured == runner.decode_graphs.buckets
    assert runner.description.endswith(", CUDA graphs") == (device.type == "cuda")
    return runner


def _same(want: torch.Tensor, got: torch.Tensor) -> None:
    """Bitwise on CPU (batch-invariant linears, row-independent kernels); on a GPU a bucket's
    GEMMs may pick other kernels than the eager batch's, so within fp32 rounding."""
    if want.device.type == "cpu":
        assert torch.equal(want, got)
    else:
        torch.testing.assert_close(got, want, atol=1e-4, rtol=0)


def _decode_steps(runner: ModelRunner, num_seqs: int, steps: int) -> list[torch.Tensor]:
    """Prefills `num_seqs` prompts of different lengths (one mixed, eager step), then decodes
    them together `steps` times, feeding back the argmax; returns each step's logits."""
    seqs = [
        _Seq(list(range(5 + i, 5 + i + 3 + 2 * i)), [4 * i + j for j in range(4)])
        for i in range(num_seqs)
    ]
    out = runner.forward([_Chunk(s, 0, len(s.token_ids), True) for s in seqs]).sampling
    logits = [out.clone()]
    for _ in range(steps):
        for seq, token in zip(seqs, out.argmax(dim=-1).tolist(), strict=True):
            seq.token_ids.append(token)
        chunks = [_Chunk(s, len(s.token_ids) - 1, 1, True) for s in seqs]
        out = runner.forward(chunks).sampling
        logits.append(out.clone())  # a graph's output is overwritten by the next replay
    return logits


def _record_replays(runner: ModelRunner) -> list[int]:
    """The bucket of each replay builder call of the runner's decode buffers."""
    buffers, sizes = runner.decode_graphs.buffers, []
    build = buffers.build_for_replay

    def recording(token_ids, positions, block_tables, batch_size):
        sizes.append(batch_size)
        return build(token_ids, positions, block_tables, batch_size)

    buffers.build_for_replay = recording
    return sizes


# (arch, rows, max_num_seqs, the bucket the rows replay in): the smallest bucket of (1, 2); a
# middle bucket of (1, 2, 4, 6), padded 3 -> 4; the largest, not a power of two, padded 5 -> 6
# (mistral: its sliding window of 8 is passed by the prompts + decode steps). Few rows each: in
# Triton's interpreter a step costs per row, and each bucket is captured by a forward of its rows.
@pytest.mark.parametrize(
    "arch,num_seqs,max_num_seqs,bucket",
    [("llama", 1, 2, 1), ("llama", 3, 6, 4), ("mistral", 5, 6, 6)],
)
def test_padded_decode_rows_equal_the_eager_step(
    arch: str, num_seqs: int, max_num_seqs: int, bucket: int, capturable
) -> None:
    eager = _runner(arch, None, capturable)
    settings = GraphSettings(max_num_seqs=max_num_seqs, max_model_len=48)
    padded = _graph_runner(arch, settings, capturable)
    replays = _record_replays(padded)
    want = _decode_steps(eager, num_seqs, steps=2)  # the second replays over the first's K/V
    got = _decode_steps(padded, num_seqs, steps=2)
    assert replays == [bucket] * 2  # every decode step went padded
    for w, g in zip(want, got, strict=True):
        _same(w, g)  # padding changes nothing in the real rows
    for (k_eager, v_eager), (k_pad, v_pad) in zip(eager.kv_caches, padded.kv_caches, strict=True):
        # The live blocks are identical: padding rows (and the captures) wrote only into the
        # scratch block past them, which the eager runner does not have.
        assert k_pad.shape[0] == NUM_BLOCKS + 1 and k_eager.shape[0] == NUM_BLOCKS
        _same(k_eager, k_pad[:NUM_BLOCKS])
        _same(v_eager, v_pad[:NUM_BLOCKS])


def test_steps_beyond_the_largest_bucket_run_eagerly_with_the_same_result(capturable) -> None:
    eager = _runner("llama", None, capturable)
    small = _graph_runner("llama", GraphSettings(max_num_seqs=2, max_model_len=48), capturable)
    replays = _record_replays(small)
    for w, g in zip(_decode_steps(eager, 3, 2), _decode_steps(small, 3, 2), strict=True):
        _same(w, g)
    assert replays == []  # 3 rows, largest bucket 2: eager steps


def test_a_path_that_plans_on_the_host_is_never_captured() -> None:
    runner = _runner("llama", GraphSettings(max_num_seqs=4, max_model_len=48))
    assert runner.decode_graphs is None  # the CPU's PyTorch path: key blocks planned per step
    assert not graphs_supported(runner.forward_path, torch.device("cuda"))
    assert runner.description == runner.forward_path.description


def test_graphs_are_asked_for_on_cuda_unless_enforce_eager() -> None:
    from engine.config import EngineConfig
    from engine.runner_factory import graph_settings

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert graph_settings(EngineConfig(max_num_seqs=16), cuda, 512) == GraphSettings(16, 512)
    assert graph_settings(EngineConfig(enforce_eager=True), cuda, 512) is None
    assert graph_settings(EngineConfig(), cpu, 512) is None


def test_a_block_table_wider_than_the_buffers_sends_the_step_eager(capturable) -> None:
    from engine.cuda_graphs.buckets import DecodeRows

    runner = _graph_runner("llama", GraphSettings(max_num_seqs=2, max_model_len=8), capturable)
    width = runner.decode_graphs.buffers.width  # 8 // 4 + 1 = 3 blocks
    wide = DecodeRows([5], [12], [list(range(width + 1))])
    assert runner.decode_graphs.run(wide) is None  # the runner then runs the step eagerly
