"""The engine API: `Engine` and the tests' fake engine both implement `EngineCore` (method for
method, parameter for parameter), the fake engine through the front door alone, and output
deltas merge and add up as outputs.py says."""

from __future__ import annotations

import ast
import inspect
from pathlib import Path

from engine import CompletionOutput, Engine, EngineCore, OutputAccumulator, RequestOutput
from tests.engine.engine_fixtures import tiny_engine
from tests.server.fake_engine import FakeEngine

PROTOCOL_METHODS = (
    "new_request",
    "add",
    "abort_request",
    "has_unfinished_requests",
    "step",
    "stats",
)


def _params(fn) -> list[str]:
    return [p for p in inspect.signature(fn).parameters if p != "self"]


def test_engine_and_fake_engine_implement_the_protocol(tmp_path) -> None:
    for impl in (tiny_engine(tmp_path), FakeEngine()):
        assert isinstance(impl, EngineCore)
        for name in PROTOCOL_METHODS:
            expected = _params(getattr(EngineCore, name))
            assert _params(getattr(type(impl), name))[: len(expected)] == expected, name
        assert impl.info.max_model_len > 0 and impl.info.kv_tokens > 0
    assert isinstance(tiny_engine(tmp_path), Engine)


def engine_modules_imported(source: str) -> set[str]:
    """The engine modules a source file imports (`engine` alone is the front door)."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            found.add(node.module)
    return {m for m in found if m == "engine" or m.startswith("engine.")}


def test_the_fake_engine_imports_only_the_front_door() -> None:
    """An engine of one's own needs nothing but engine/__init__.py (what a server may import)."""
    fake = Path(__file__).resolve().parents[1] / "server" / "fake_engine.py"
    assert engine_modules_imported(fake.read_text()) == {"engine"}
    # The check sees a reach past the door, at the top or inside a function.
    behind = "from engine import Request\ndef f():\n    import engine.requests.request\n"
    assert engine_modules_imported(behind) == {"engine", "engine.requests.request"}


def _delta(
    text: str, ids: tuple[int, ...], text_offset: int, token_offset: int, **kw
) -> CompletionOutput:
    return CompletionOutput(0, text, ids, text_offset=text_offset, token_offset=token_offset, **kw)


def _out(*completions: CompletionOutput, finished: bool = False) -> RequestOutput:
    return RequestOutput("r", (1,), completions, finished)


def test_in_order_deltas_merge_into_one_delta() -> None:
    a = _delta("ab", (1, 2), 0, 0)
    b = _delta("c", (3,), 2, 2, finish_reason="stop")
    merged = _out(a).merge(_out(b)).outputs[0]
    assert (merged.text, merged.token_ids, merged.text_offset, merged.token_offset) == (
        "abc",
        (1, 2, 3),
        0,
        0,
    )
    assert merged.finish_reason == "stop"
    later = _delta("de", (4, 5), 3, 3).merge(_delta("f", (6,), 5, 5))
    assert (later.text, later.token_ids, later.text_offset, later.num_tokens) == (
        "def",
        (4, 5, 6),
        3,
        6,
    )


def test_a_restart_from_offset_zero_replaces_what_was_held() -> None:
    held = _delta("xy", (7, 8), 4, 4)
    whole = _delta("best one", (1, 2, 3), 0, 0)
    assert held.merge(whole) == whole
    acc = OutputAccumulator()
    acc.add(_out(_delta("abcd", (1, 2, 3, 4), 0, 0)))
    acc.add(_out(_delta("xy", (7, 8), 4, 4)))
    assert acc.result().outputs[0].text == "abcdxy"
    acc.add(_out(whole, finished=True))
    result = acc.result()
    assert (
        result.finished
        and result.outputs[0].text == "best one"
        and result.outputs[0].token_ids == (1, 2, 3)
    )


def test_accumulated_deltas_keep_logprobs_and_prompt_logprobs() -> None:
    from engine import TokenLogprob

    acc = OutputAccumulator()
    lp = [TokenLogprob(i, -float(i)) for i in range(3)]
    first = RequestOutput(
        "r", (1, 2), (_delta("a", (0,), 0, 0, logprobs=(lp[0],)),), False, (None, lp[1])
    )
    acc.add(first)
    acc.add(_out(_delta("bc", (1, 2), 1, 1, logprobs=(lp[1], lp[2])), finished=True))
    result = acc.result()
    assert result.outputs[0].logprobs == tuple(lp) and result.prompt_logprobs == (None, lp[1])
