"""fast_frozen (engine/fast_frozen.py): the cheap constructor gives the instance the dataclass's
own generated constructor gives (the oracle: the same class decorated without it), for
positional, keyword and defaulted calls, default factories included; the instance stays frozen,
equal, hashable, replaceable and picklable; classes whose constructor does more are refused.
"""

from __future__ import annotations

import dataclasses
import pickle
from dataclasses import InitVar, dataclass, field

import pytest

from engine.fast_frozen import fast_frozen
from engine.requests.outputs import CompletionOutput, RequestOutput
from engine.scheduling.step_plan import ScheduledChunk


def _pair():
    """The same frozen dataclass twice: with the generated constructor, and with fast_frozen's."""

    def make():
        @dataclass(frozen=True)
        class Row:
            index: int
            text: str
            ids: tuple[int, ...] = ()
            extra: dict = field(default_factory=dict, compare=False)
            reason: str | None = None

        return Row

    return make(), fast_frozen(make())


CALLS = [
    ((0, "a"), {}),
    ((1, "b", (1, 2)), {"reason": "stop"}),
    ((), {"index": 2, "text": "c", "extra": {"k": 1}}),
    ((3, "d", (4,), {"x": 2}, "length"), {}),
]


@pytest.mark.parametrize("args, kwargs", CALLS)
def test_the_fast_constructor_builds_what_the_generated_one_builds(args, kwargs):
    slow_cls, fast_cls = _pair()
    slow, fast = slow_cls(*args, **kwargs), fast_cls(*args, **kwargs)
    assert vars(fast) == vars(slow)
    assert repr(fast).split("(", 1)[1] == repr(slow).split("(", 1)[1]
    assert fast == fast_cls(*args, **kwargs) and hash(fast) == hash(fast_cls(*args, **kwargs))
    assert dataclasses.replace(fast, text="z").text == "z"
    chunk = ScheduledChunk(None, None, 3, 1, True)  # (module level: pickle finds it by name)
    assert pickle.loads(pickle.dumps(chunk)) == chunk
    with pytest.raises(dataclasses.FrozenInstanceError):
        fast.text = "changed"


def test_a_default_factory_gives_each_instance_its_own_value():
    _, fast_cls = _pair()
    first, second = fast_cls(0, "a"), fast_cls(1, "b")
    assert first.extra == {} and first.extra is not second.extra


def test_missing_or_unknown_arguments_are_refused_as_by_the_generated_constructor():
    slow_cls, fast_cls = _pair()
    for cls in (slow_cls, fast_cls):
        with pytest.raises(TypeError):
            cls(0)
        with pytest.raises(TypeError):
            cls(0, "a", nope=1)


def test_the_per_row_classes_use_it():
    for cls in (ScheduledChunk, CompletionOutput, RequestOutput):
        assert cls.__init__.__doc__ == "Stores the fields (engine/fast_frozen.py)."


def test_classes_whose_constructor_does_more_are_refused():
    @dataclass(frozen=True)
    class Checked:
        value: int

        def __post_init__(self) -> None:
            if self.value < 0:
                raise ValueError("negative")

    @dataclass(frozen=True)
    class WithInitVar:
        value: int
        scale: InitVar[int] = 1

    @dataclass
    class Mutable:
        value: int

    for cls in (Checked, WithInitVar, Mutable):
        with pytest.raises(TypeError):
            fast_frozen(cls)
