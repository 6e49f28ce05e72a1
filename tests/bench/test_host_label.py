"""`tgserve bench` measures what the server runs: `--dtype auto` (the default) resolves to the
dtype an engine with default settings loads on this host (the oracle: such an engine's own
parameters), and every result names the host's ISA (hand-worked flag sets) or GPU."""

from __future__ import annotations

import json

from bench.host_label import isa_names
from bench.random_models import RANDOM_SHAPES
from engine import Engine, EngineConfig
from models.cpu_features import cpu_flags
from server.cli import main


def test_isa_names_follow_the_flags():
    ice_lake = ["fpu", "avx2", "avx512f", "avx512_vnni", "fma"]
    sapphire = [*ice_lake, "avx512_bf16", "amx_tile", "amx_bf16", "amx_int8"]
    assert isa_names(ice_lake) == ["AVX-512", "VNNI"]
    assert isa_names(sapphire) == ["AVX-512", "BF16", "VNNI", "AMX"]
    assert isa_names(["avx2", "fma", "avx_vnni"]) == ["AVX2", "VNNI"]
    assert isa_names(["sse4_2"]) == []
    neoverse_v1 = ["fp", "asimd", "evtstrm", "aes", "asimddp", "sha512", "sve", "bf16"]
    assert isa_names(neoverse_v1) == ["NEON", "SVE", "DOTPROD"]
    assert isa_names(["fp", "asimd", "evtstrm"]) == ["NEON"]


def test_the_default_dtype_is_what_a_default_engine_loads_and_tables_say_so(capsys):
    engine = Engine.from_random_weights(
        "random:tiny-llama",
        RANDOM_SHAPES["tiny-llama"],
        EngineConfig(device="cpu", max_model_len=64, cpu_kernels=False),
    )
    served = str(next(engine.runner.model.parameters()).dtype).removeprefix("torch.")
    argv = "bench latency --model random:tiny-llama --device cpu --input-len 4 --output-len 3 "
    argv += "--runs 1 --warmup-runs 0 --disable-cpu-kernels --skip-limits"
    assert main([*argv.split(), "--json"]) == 0
    (result,) = [json.loads(x) for x in capsys.readouterr().out.splitlines() if x.strip()]
    assert result["dtype"] == served and result["dtype_auto"] is True
    isa = "+".join(isa_names(cpu_flags())) or "(no AVX2)"
    assert result["host"] == f"CPU {isa}"
    assert main(argv.split()) == 0
    table = capsys.readouterr().out
    assert f"{served} (--dtype auto)" in table and f"on CPU {isa}" in table


def test_a_forced_kernel_build_is_named_beside_the_host(monkeypatch):
    from bench.host_label import host_label

    native = host_label("cpu")
    monkeypatch.setenv("TGSERVE_CPU_ISA", "portable")  # every x86-64 host can run it
    assert host_label("cpu") == f"{native} (kernels: portable build)"
    monkeypatch.setenv("TGSERVE_CPU_ISA", "avx3")
    assert host_label("cpu") == f"{native} (kernels: TGSERVE_CPU_ISA=avx3 refused)"
