"""`tgserve bench lora` (bench/lora_speed.py): its random adapters are PEFT folders tgserve loads
(all seven projections, the asked rank, lora_B non-zero), and a tiny run prints both ratios."""

from __future__ import annotations

import argparse

import pytest

from bench.cli_tools import add_lora_arguments
from bench.lora_speed import run_lora_bench, write_random_adapters
from models.config import ModelConfig
from models.lora import load_peft_folder
from tests.checkpoints import make_hf_model, save_checkpoint


def test_random_adapters_load_as_peft_folders(tmp_path) -> None:
    config = ModelConfig.from_hf_dict(make_hf_model("llama").config.to_dict())
    pairs = write_random_adapters(tmp_path, config, count=2, rank=4)
    assert [name for name, _ in pairs] == ["a0", "a1"]
    adapter = load_peft_folder(pairs[1][1], "a1", config)
    assert len(adapter.modules) == 7 * config.num_layers and adapter.max_rank == 4
    assert all(m.b.abs().sum() > 0 and m.scale == 2.0 for m in adapter.modules.values())


@pytest.mark.cpu_kernels
def test_a_tiny_run_prints_both_ratios(tmp_path, capsys) -> None:
    save_checkpoint("llama", tmp_path / "tiny")
    parser = argparse.ArgumentParser()
    add_lora_arguments(parser)
    args = parser.parse_args(
        ["--model", str(tmp_path / "tiny"), "--adapters", "2", "--rank", "4", "--requests", "3",
         "--prompt-len", "5", "--output-len", "3", "--decode-tokens", "3", "--repeats", "1"]
    )  # fmt: skip
    assert run_lora_bench(args) == 0
    out = capsys.readouterr().out
    assert "offline 3 x 5/3 over 2 adapters:" in out and "batch-1 decode with an adapter:" in out
