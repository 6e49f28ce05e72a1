"""FaultSpec (engine/requests/fault_spec.py): exactly one fault, a positive token count, and
when it is due, on hand-worked counts."""

from __future__ import annotations

import pytest

from engine import FatalEngineError, FaultSpec


def test_fault_spec_names_exactly_one_positive_count():
    assert FaultSpec(fail_after_tokens=3).due(2) is None
    assert FaultSpec(fail_after_tokens=3).due(3) == "fail"
    assert FaultSpec(kill_engine_after_tokens=1).due(1) == "kill"
    for bad in ({}, {"fail_after_tokens": 1, "kill_engine_after_tokens": 1}):
        with pytest.raises(ValueError, match="exactly one"):
            FaultSpec(**bad)
    for count in (0, -1, True, 1.5):
        with pytest.raises(ValueError, match="fault"):
            FaultSpec(fail_after_tokens=count)


def test_a_kill_names_the_request_and_its_count():
    error = FaultSpec(kill_engine_after_tokens=4).kill_error("req-7")
    assert isinstance(error, FatalEngineError)
    assert "req-7" in str(error) and "4 generated token(s)" in str(error)
    assert FaultSpec(fail_after_tokens=2).error_message().endswith("after 2 generated token(s)")
