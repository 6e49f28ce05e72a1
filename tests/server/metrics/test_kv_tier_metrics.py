"""The K/V tiers on the serving floor: their Prometheus families (values from the engine's
TierStats, promtool-clean, absent without tiers) and their flags (`tgserve serve
--kv-offload-dir ...` -> EngineConfig.kv_tiers)."""

from __future__ import annotations

import argparse
from types import SimpleNamespace

import pytest
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from engine import EngineConfig, KVTierConfig, kv_tier_config
from engine.kv_tiers.tier_stats import TierStats
from server import serve
from server.metrics.kv_tiers import KVTierCollector
from server.settings import Settings
from tests.debian_tools import debian_tool
from tests.server.metrics.test_metrics import _promtool


def _scrape(stats) -> str:
    registry = CollectorRegistry()
    registry.register(KVTierCollector(lambda: stats))
    return generate_latest(registry).decode()


def test_families_carry_hits_and_bytes_per_tier() -> None:
    tiers = TierStats(
        ram_hits=7,
        ram_hit_bytes=700,
        ram_bytes=1000,
        ram_blocks=10,
        disk_hits=3,
        disk_hit_bytes=300,
        disk_bytes=5000,
        disk_written_bytes=6000,
        disk_rejected=2,
        saved_blocks=12,
    )
    text = _scrape(SimpleNamespace(kv_tiers=tiers))
    got = {
        (s.name, s.labels.get("tier")): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }
    assert got[("tgserve_kv_offload_hits_total", "ram")] == 7
    assert got[("tgserve_kv_offload_hits_total", "disk")] == 3
    assert got[("tgserve_kv_offload_hit_bytes_total", "disk")] == 300
    assert got[("tgserve_kv_offload_bytes", "ram")] == 1000
    assert got[("tgserve_kv_offload_bytes", "disk")] == 5000
    assert got[("tgserve_kv_offload_saved_blocks_total", None)] == 12
    assert got[("tgserve_kv_offload_written_bytes_total", None)] == 6000
    assert got[("tgserve_kv_offload_rejected_files_total", None)] == 2
    lint = _promtool(debian_tool("promtool", "prometheus"), text)
    assert lint.returncode == 0 and not lint.stdout + lint.stderr, lint


def test_nothing_is_exported_without_tiers() -> None:
    assert _scrape(SimpleNamespace(kv_tiers=None)) == ""
    assert _scrape(None) == ""


def _settings(argv: list[str]) -> Settings:
    parser = argparse.ArgumentParser()
    serve.add_arguments(parser)
    return Settings.resolve(parser.parse_args(argv), {})


def test_flags_build_the_tier_config(tmp_path) -> None:
    s = _settings(["--kv-offload-dir", str(tmp_path), "--kv-offload-bytes", "2GiB"])
    built = kv_tier_config(s.kv_offload_ram_bytes, s.kv_offload_dir, s.kv_offload_bytes)
    assert built == KVTierConfig(None, str(tmp_path), 2 << 30)
    assert built.ram_limit == 1 << 30  # a disk tier stages its reads in a RAM tier
    s = _settings(["--kv-offload-ram-bytes", "512MiB"])
    built = kv_tier_config(s.kv_offload_ram_bytes, s.kv_offload_dir, s.kv_offload_bytes)
    assert built == KVTierConfig(512 << 20) and built.disk_dir is None
    assert kv_tier_config(None, None, None) is None


def test_bad_tier_settings_are_refused_naming_the_flag() -> None:
    with pytest.raises(ValueError, match="kv_offload_bytes needs kv_offload_dir"):
        kv_tier_config(None, None, 1 << 30)
    with pytest.raises(ValueError, match="kv_offload_ram_bytes must be a positive"):
        kv_tier_config(0, None, None)
    with pytest.raises(ValueError, match="tensor_parallel_size 1"):
        EngineConfig(kv_tiers=KVTierConfig(1 << 20), tensor_parallel_size=2)
