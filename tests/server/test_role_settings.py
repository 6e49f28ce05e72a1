"""`--role prefill|decode` refuses, before anything starts, the settings it cannot serve with:
each ValueError names the flag to fix (hand-written cases)."""

from __future__ import annotations

import pytest

from server.settings import Settings

ADDR = {"kv_transfer_addr": "10.0.0.2:29600"}


@pytest.mark.parametrize(
    ("values", "named"),
    [
        ({"role": "prefill"}, "--kv-transfer-addr HOST:PORT"),
        ({"role": "prefill", "kv_transfer_addr": "10.0.0.2"}, "--kv-transfer-addr HOST:PORT"),
        ({"role": "decode", "kv_transfer_addr": "h:70000"}, "--kv-transfer-addr HOST:PORT"),
        ({"role": "decode", **ADDR}, "--prefill-url http://HOST:PORT"),
        ({"role": "prefill", **ADDR, "tensor_parallel_size": 2}, "no tensor or pipeline"),
        ({"role": "prefill", **ADDR, "pipeline_parallel_size": 2}, "no tensor or pipeline"),
        ({"role": "prefill", **ADDR, "disable_prefix_caching": True}, "needs prefix caching"),
    ],
)
def test_a_role_without_what_it_needs_is_refused_naming_the_flag(values, named) -> None:
    with pytest.raises(ValueError, match=named):
        Settings(**values)


def test_complete_role_settings_are_accepted() -> None:
    Settings(role="prefill", **ADDR)
    Settings(role="decode", prefill_url="http://10.0.0.3:8000", **ADDR)
