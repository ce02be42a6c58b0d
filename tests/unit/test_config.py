from dataclasses import dataclass

import pytest

from crescent.common.config import CommonSettings, load_settings, setting, to_argv
from crescent.common.errors import ConfigError
from crescent.decode.worker import DecodeSettings


@dataclass
class Example(CommonSettings):
    """Example settings."""

    batch_size: int = setting(8, "a number")
    is_fast: bool = setting(False, "a flag")


def test_defaults_apply_without_flags_or_environment():
    settings = load_settings(Example, [], {})
    assert settings.batch_size == 8 and settings.is_fast is False and settings.cluster == "dev"


def test_environment_overrides_default():
    settings = load_settings(Example, [], {"CRESCENT_BATCH_SIZE": "16", "CRESCENT_IS_FAST": "yes"})
    assert settings.batch_size == 16 and settings.is_fast is True


def test_flag_overrides_environment():
    environ = {"CRESCENT_BATCH_SIZE": "16", "CRESCENT_NATS_URL": "nats://env:1"}
    settings = load_settings(Example, ["--batch-size", "32", "--no-is-fast"], environ)
    assert (
        settings.batch_size == 32
        and settings.is_fast is False
        and settings.nats_url == "nats://env:1"
    )


def test_bad_environment_value_names_the_variable():
    with pytest.raises(ConfigError, match="CRESCENT_BATCH_SIZE"):
        load_settings(Example, [], {"CRESCENT_BATCH_SIZE": "many"})
    with pytest.raises(ConfigError, match="CRESCENT_IS_FAST"):
        load_settings(Example, [], {"CRESCENT_IS_FAST": "maybe"})


def test_bad_flag_exits_with_usage(capsys):
    with pytest.raises(SystemExit) as info:
        load_settings(Example, ["--batch-size", "many"], {})
    assert info.value.code == 2
    assert "batch-size" in capsys.readouterr().err


def test_validation_runs_after_loading():
    with pytest.raises(ConfigError, match="lease_ttl_s"):
        load_settings(Example, ["--lease-ttl-s", "0"], {})
    with pytest.raises(ConfigError, match="kv_capacity_tokens"):
        load_settings(DecodeSettings, [], {"CRESCENT_KV_CAPACITY_TOKENS": "-1"})


def test_to_argv_round_trips():
    settings = load_settings(Example, ["--batch-size", "3", "--is-fast", "--node", "n7"], {})
    assert load_settings(Example, to_argv(settings), {}) == settings


def test_help_documents_variable_and_default(capsys):
    with pytest.raises(SystemExit):
        load_settings(Example, ["--help"], {})
    out = capsys.readouterr().out
    assert "CRESCENT_BATCH_SIZE" in out and "default 8" in out
