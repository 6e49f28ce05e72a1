"""The long-prompt stage of `tgserve bench latency` (issue 46): a 4,096-token prompt runs through
the CLI on the C++ CPU path and is reported at that length with the host's ISA; a stage whose
prompt and output overflow the model's context (8,192 + 16 on an 8,192-token model) fails
before any weights load, naming the longest --input-len that fits (8,192 - 16, worked by hand).
"""

from __future__ import annotations

import json

import pytest

from bench.host_label import isa_names
from models.cpu_features import cpu_flags
from server.cli import main
from tests.devices import selected_device

BASE = "bench latency --model random:tiny-llama --device cpu --runs 1 --warmup-runs 0 --skip-limits"


@pytest.mark.skipif(selected_device().type != "cpu", reason="the CPU path's long prompts")
def test_a_4096_token_prompt_is_measured_on_the_cpp_path(capsys) -> None:
    argv = f"{BASE} --input-len 4096 --output-len 2 --json".split()
    assert main(argv) == 0
    (result,) = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert result["input_len"] == 4096 and result["output_len"] == 2
    assert result["prefill_tok_s"] > 0 and result["decode_tok_s"] > 0
    assert "C++ CPU kernels" in result["note"]
    isa = "+".join(isa_names(cpu_flags())) or "(no AVX2)"
    assert result["host"].startswith(f"CPU {isa}")


def test_a_stage_past_the_context_fails_before_loading_and_names_what_fits(capsys) -> None:
    assert main(f"{BASE} --input-len 8192 --output-len 16".split()) != 0
    err = capsys.readouterr().err
    assert "context length 8192" in err and "--input-len 8176" in err, err
    assert "--input-len 8192 + --output-len 16" in err, err
