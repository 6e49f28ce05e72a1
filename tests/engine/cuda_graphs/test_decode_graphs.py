"""Decode steps through the graph machinery (static buffers, bucket padding) give the real rows
exactly what the eager step gives, and padding writes into no live KV block. On CPU nothing is
captured: the same function runs eagerly over the same buffers a CUDA graph would read."""

from __future__ import annotations

import pytest
import torch

from engine.cuda_graphs.decode_graphs import GraphSettings, graphs_supported
from engine.model_runner import ModelRunner
from models import build_model
from models.config import ModelConfig
from tests.checkpoints import make_hf_model
from tests.engine.test_model_runner import _Chunk, _Seq

NUM_BLOCKS, BLOCK_SIZE = 24, 4


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
    """On CPU: the graph machinery run eagerly. On CUDA: captured graphs, where the device's
    forward path can be captured (else the test is skipped, saying so)."""
    runner = _runner(arch, graphs, device)
    if runner.decode_graphs is None:
        pytest.skip(f"{runner.forward_path.description} on {device} cannot be captured")
    assert runner.decode_graphs.captured == (
        runner.decode_graphs.buckets if device.type == "cuda" else ()
    )
    return runner


def _same(want: torch.Tensor, got: torch.Tensor) -> None:
    """Bitwise on CPU (batch-invariant kernels); on a GPU a bucket's GEMMs may pick other
    kernels than the eager batch's, so within fp32 rounding."""
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
    out = runner.execute([_Chunk(s, 0, len(s.token_ids), True) for s in seqs]).sampling
    logits = [out]
    for _ in range(steps):
        for seq, token in zip(seqs, out.argmax(dim=-1).tolist(), strict=True):
            seq.token_ids.append(token)
        chunks = [_Chunk(s, len(s.token_ids) - 1, 1, True) for s in seqs]
        out = runner.execute(chunks).sampling
        logits.append(out)
    return logits


@pytest.mark.parametrize("arch", ["llama", "mistral"])
@pytest.mark.parametrize("num_seqs", [1, 3, 5])
def test_padded_decode_rows_equal_the_eager_step(arch: str, num_seqs: int, device) -> None:
    eager = _runner(arch, None, device)
    padded = _graph_runner(arch, GraphSettings(max_num_seqs=8, max_model_len=48), device)
    filled = _record_fills(padded)
    want = _decode_steps(eager, num_seqs, steps=3)
    got = _decode_steps(padded, num_seqs, steps=3)
    assert filled == [{1: 1, 3: 4, 5: 8}[num_seqs]] * 3  # every decode step went padded
    for w, g in zip(want, got, strict=True):
        _same(w, g)  # padding changes nothing in the real rows
    for (k_eager, v_eager), (k_pad, v_pad) in zip(eager.kv_caches, padded.kv_caches, strict=True):
        # The live blocks are identical: padding rows wrote only into the scratch block past
        # them, which the eager runner does not have.
        assert k_pad.shape[0] == NUM_BLOCKS + 1 and k_eager.shape[0] == NUM_BLOCKS
        _same(k_eager, k_pad[:NUM_BLOCKS])
        _same(v_eager, v_pad[:NUM_BLOCKS])


def _record_fills(runner: ModelRunner) -> list[int]:
    """The number of rows (the bucket) of each fill of the runner's static decode inputs."""
    inputs, sizes = runner.decode_graphs.inputs, []
    fill = inputs.fill

    def recording(rows):
        sizes.append(rows.num_rows)
        fill(rows)

    inputs.fill = recording
    return sizes


def test_steps_beyond_the_largest_bucket_run_eagerly_with_the_same_result(device) -> None:
    eager = _runner("llama", None, device)
    small = _graph_runner("llama", GraphSettings(max_num_seqs=2, max_model_len=48), device)
    filled = _record_fills(small)
    for w, g in zip(_decode_steps(eager, 3, 2), _decode_steps(small, 3, 2), strict=True):
        _same(w, g)
    assert filled == []  # 3 rows, largest bucket 2: eager steps


def test_the_cpu_never_captures() -> None:
    runner = _runner("llama", GraphSettings(max_num_seqs=4, max_model_len=48))
    assert runner.decode_graphs is not None and runner.decode_graphs.captured == ()
    assert not graphs_supported(runner.forward_path, torch.device("cpu"))


def test_graphs_are_asked_for_on_cuda_unless_enforce_eager() -> None:
    from engine.config import EngineConfig
    from engine.engine_factory import graph_settings

    cuda, cpu = torch.device("cuda"), torch.device("cpu")
    assert graph_settings(EngineConfig(max_num_seqs=16), cuda, 512) == GraphSettings(16, 512)
    assert graph_settings(EngineConfig(enforce_eager=True), cuda, 512) is None
    assert graph_settings(EngineConfig(), cpu, 512) is None


def test_a_block_table_wider_than_the_buffers_sends_the_step_eager() -> None:
    from engine.cuda_graphs.buckets import DecodeRows
    from engine.cuda_graphs.decode_graphs import DecodeGraphs
    from engine.cuda_graphs.static_inputs import StaticDecodeInputs

    inputs = StaticDecodeInputs(4, max_blocks_per_seq=2, device=torch.device("cpu"))
    graphs = DecodeGraphs(None, inputs, GraphSettings(4, 8), BLOCK_SIZE, None, NUM_BLOCKS)
    wide = DecodeRows([5], [12], [13], [[0, 1, 2, 3]], [13])
    assert graphs.run(wide) is None  # the runner then runs the step eagerly
    assert inputs.input_ids.tolist() == [0, 0, 0, 0]  # nothing was filled
