"""`tgserve bench short-behind-long` covers both kinds of long prompts: a set of loaded runs with
the long requests streamed and one with them not streamed (the issue's head-of-line case), each
reporting the short request's TTFT, against a live server (the fake engine)."""

from __future__ import annotations

from bench.short_behind_long import ProbeSpec, render, run_probe
from tests.server.fake_engine import FakeEngine
from tests.server.live import LiveServer


def test_the_probe_runs_streamed_and_not_streamed_long_prompts():
    with LiveServer(lambda: FakeEngine(max_model_len=128, num_blocks=256)) as live:
        spec = ProbeSpec(live.url, num_long=4, long_len=40, short_len=3, delay_s=0.05, runs=2)
        idle, loaded = run_probe(spec)
        assert live.state.engine.num_pending() == 0  # every long request ended
    assert len(idle) == 2 and all(t > 0 for t in idle)
    assert [r.long_streamed for r in loaded] == [True, True, False, False]
    assert all(r.ttft_s > 0 for r in loaded)
    text = render(spec, idle, loaded)
    assert "long prompts streamed:" in text and "long prompts not streamed:" in text
