"""`tgserve serve` settings: every flag also comes from TGSERVE_*, the flag wins, the variable is
read when settings are resolved (not at import), and bad values name the flag and variable.
"""

from __future__ import annotations

import argparse
from dataclasses import fields

import pytest

from server import serve
from server.options import OPTIONS, parse_size
from server.settings import Settings


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser()
    serve.add_arguments(p)
    return p


def test_every_setting_has_a_flag_and_an_environment_variable():
    assert {o.dest for o in OPTIONS} == {f.name for f in fields(Settings)}
    help_text = parser().format_help()
    for option in OPTIONS:
        assert option.flag in help_text and option.env in help_text


def test_flag_beats_environment_beats_default():
    args = parser().parse_args(["--port", "9001", "--max-num-seqs", "4"])
    env = {"TGSERVE_PORT": "7000", "TGSERVE_MAX_NUM_SEQS": "99", "TGSERVE_SHUTDOWN_TIMEOUT": "2.5"}
    settings = Settings.resolve(args, env)
    assert (settings.port, settings.max_num_seqs, settings.shutdown_timeout) == (9001, 4, 2.5)
    assert settings.host == "0.0.0.0" and settings.max_model_len is None


def test_environment_is_read_at_resolve_time(monkeypatch):
    import os

    args = parser().parse_args([])
    monkeypatch.setenv("TGSERVE_MODEL", "/models/late")
    assert Settings.resolve(args, os.environ).model == "/models/late"


def test_repeatable_flags_and_comma_separated_variables():
    args = parser().parse_args(["--api-key", "a", "--api-key", "b"])
    assert Settings.resolve(args, {"TGSERVE_API_KEY": "x,y"}).api_key == ("a", "b")
    from_env = Settings.resolve(
        parser().parse_args([]), {"TGSERVE_API_KEY": "x, y", "TGSERVE_SERVED_MODEL_NAME": "m1"}
    )
    assert from_env.api_key == ("x", "y") and from_env.served_model_name == ("m1",)


def test_switches_from_flag_or_boolean_variable():
    assert Settings.resolve(
        parser().parse_args(["--disable-prefix-caching"]), {}
    ).disable_prefix_caching
    assert Settings.resolve(
        parser().parse_args([]), {"TGSERVE_DISABLE_PREFIX_CACHING": "true"}
    ).disable_prefix_caching
    assert not Settings.resolve(
        parser().parse_args([]), {"TGSERVE_DISABLE_PREFIX_CACHING": "0"}
    ).disable_prefix_caching
    assert Settings.resolve(parser().parse_args(["--enforce-eager"]), {}).enforce_eager
    assert Settings.resolve(parser().parse_args([]), {"TGSERVE_ENFORCE_EAGER": "1"}).enforce_eager
    assert not Settings.resolve(parser().parse_args([]), {}).enforce_eager
    assert Settings.resolve(parser().parse_args(["--batch-invariant"]), {}).batch_invariant
    assert Settings.resolve(
        parser().parse_args([]), {"TGSERVE_BATCH_INVARIANT": "1"}
    ).batch_invariant
    assert not Settings.resolve(parser().parse_args([]), {}).batch_invariant


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1000", 1000),
        ("512MiB", 512 * 2**20),
        ("2GB", 2 * 10**9),
        ("1.5GiB", int(1.5 * 2**30)),
        ("64k", 64_000),
        ("3 G", 3 * 10**9),
    ],
)
def test_sizes_accept_binary_and_decimal_units(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "lots", "12XB", "-5MiB"])
def test_bad_sizes_are_refused(text):
    with pytest.raises(ValueError, match="size"):
        parse_size(text)


def test_bad_values_name_the_flag_and_variable():
    with pytest.raises(ValueError, match="TGSERVE_PORT.*--port"):
        Settings.resolve(parser().parse_args([]), {"TGSERVE_PORT": "eighty"})
    with pytest.raises(ValueError, match="TGSERVE_KV_CACHE_MEMORY"):
        Settings.resolve(parser().parse_args([]), {"TGSERVE_KV_CACHE_MEMORY": "big"})
    with pytest.raises(ValueError, match="--port"):
        Settings(port=70000)
    with pytest.raises(SystemExit):  # argparse reports a bad flag value itself
        parser().parse_args(["--shutdown-timeout", "-1"])


def test_run_refuses_a_missing_model_path_before_starting(tmp_path):
    args = parser().parse_args(["--model", str(tmp_path / "nowhere")])
    with pytest.raises(FileNotFoundError, match="does not exist"):
        serve.run(args)


def test_shutdown_timeout_zero_is_allowed_and_negative_is_refused():
    assert (
        Settings.resolve(parser().parse_args(["--shutdown-timeout", "0"]), {}).shutdown_timeout == 0
    )
    env = {"TGSERVE_SHUTDOWN_TIMEOUT": "0"}
    assert Settings.resolve(parser().parse_args([]), env).shutdown_timeout == 0
    with pytest.raises(ValueError, match="TGSERVE_SHUTDOWN_TIMEOUT"):
        Settings.resolve(parser().parse_args([]), {"TGSERVE_SHUTDOWN_TIMEOUT": "-1"})
    with pytest.raises(ValueError, match="shutdown-timeout"):
        Settings(shutdown_timeout=float("inf"))


def test_help_says_every_default_and_lists_the_choices():
    help_text = " ".join(parser().format_help().split())  # argparse wraps lines
    assert "default None" not in help_text and "default: None" not in help_text
    for option in OPTIONS:
        flag_help = help_text.split(option.flag, 1)[1].split(option.env, 1)[0]
        assert "(default: " in flag_help, option.flag
        if option.choices:
            assert "{" + ",".join(option.choices) + "}" in flag_help, option.flag
    from engine import EngineConfig  # the engine's own default, not a copy

    assert f"(default: {EngineConfig.max_num_seqs})" in help_text.split("--max-num-seqs", 2)[2]


def test_choices_are_enforced_from_the_flag_and_the_variable(capsys):
    with pytest.raises(SystemExit):
        parser().parse_args(["--dtype", "float64"])
    assert "invalid choice: 'float64'" in capsys.readouterr().err
    with pytest.raises(ValueError, match="TGSERVE_DTYPE .*auto, float32, bfloat16, float16"):
        Settings.resolve(parser().parse_args([]), {"TGSERVE_DTYPE": "float64"})
    assert Settings.resolve(parser().parse_args(["--log-level", "DEBUG"]), {}).log_level == "debug"
