"""Settings from CLI flags and environment variables of the same names.

A setting `nats_url` is the flag `--nats-url` and the variable `CRESCENT_NATS_URL`; the flag
wins over the variable, the variable over the documented default. Every service declares its
settings as a dataclass built from `setting(...)` fields, so `--help` lists each one with its
variable and default, and tests can build settings without touching the process environment.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import typing
from collections.abc import Mapping, Sequence
from typing import Any, TypeVar

from crescent.common.errors import ConfigError

ENV_PREFIX = "CRESCENT_"
_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}

T = TypeVar("T")


def setting(default: Any, help: str) -> Any:
    """A settings field with its help text."""
    return dataclasses.field(default=default, metadata={"help": help})


def flag_name(name: str) -> str:
    return "--" + name.replace("_", "-")


def env_name(name: str) -> str:
    return ENV_PREFIX + name.upper()


def _convert(name: str, kind: type, raw: str) -> Any:
    if kind is bool:
        lowered = raw.strip().lower()
        if lowered in _TRUE:
            return True
        if lowered in _FALSE:
            return False
        raise ConfigError(f"{name}: {raw!r} is not a boolean (use one of {sorted(_TRUE | _FALSE)})")
    try:
        return kind(raw)
    except ValueError as exc:
        raise ConfigError(f"{name}: {raw!r} is not a valid {kind.__name__}") from exc


def build_parser(
    cls: type, prog: str | None = None, description: str | None = None
) -> argparse.ArgumentParser:
    """An argparse parser whose flags mirror the dataclass fields of `cls`."""
    parser = argparse.ArgumentParser(prog=prog, description=description or cls.__doc__)
    hints = typing.get_type_hints(cls)
    for field in dataclasses.fields(cls):
        kind = hints[field.name]
        help_text = (
            f"{field.metadata.get('help', '')} "
            f"[env {env_name(field.name)}; default {field.default!r}]"
        )
        if kind is bool:
            parser.add_argument(
                flag_name(field.name),
                dest=field.name,
                action=argparse.BooleanOptionalAction,
                default=argparse.SUPPRESS,
                help=help_text,
            )
        else:
            parser.add_argument(
                flag_name(field.name),
                dest=field.name,
                type=kind,
                default=argparse.SUPPRESS,
                help=help_text,
                metavar=field.name.upper(),
            )
    return parser


def load_settings(
    cls: type[T],
    argv: Sequence[str] | None = None,
    environ: Mapping[str, str] | None = None,
    prog: str | None = None,
) -> T:
    """Build `cls` from flags (highest precedence), then environment, then defaults.

    Bad flags exit through argparse with a usage message; a bad environment value raises
    ConfigError naming the variable.
    """
    environ = os.environ if environ is None else environ
    parsed = vars(build_parser(cls, prog).parse_args(argv))
    hints = typing.get_type_hints(cls)
    values: dict[str, Any] = {}
    for field in dataclasses.fields(cls):
        if field.name in parsed:
            values[field.name] = parsed[field.name]
        elif env_name(field.name) in environ:
            values[field.name] = _convert(
                env_name(field.name), hints[field.name], environ[env_name(field.name)]
            )
    settings = cls(**values)
    validate = getattr(settings, "validate", None)
    if validate is not None:
        validate()
    return settings


def to_argv(settings: object) -> list[str]:
    """The flags that rebuild `settings`: how a supervisor passes settings to a child process."""
    argv: list[str] = []
    for field in dataclasses.fields(settings):
        value = getattr(settings, field.name)
        if isinstance(value, bool):
            argv.append(flag_name(field.name) if value else "--no-" + field.name.replace("_", "-"))
        else:
            argv += [flag_name(field.name), str(value)]
    return argv


@dataclasses.dataclass
class CommonSettings:
    """Settings every Crescent service has."""

    cluster: str = setting("dev", "cluster name: prefixes NATS subjects and etcd keys")
    nats_url: str = setting("nats://127.0.0.1:4222", "NATS server URL(s), comma-separated")
    etcd_url: str = setting("http://127.0.0.1:2379", "etcd endpoint")
    node: str = setting(
        "node0", "name of the machine this instance runs on (instances on one node share a store)"
    )
    instance_id: str = setting("", "unique id of this instance; empty picks <role>-<random>")
    host: str = setting("127.0.0.1", "address this instance's HTTP endpoint binds to")
    advertise_host: str = setting(
        "",
        "address peers use to reach this instance "
        "(empty: host, or the hostname when host is 0.0.0.0)",
    )
    http_port: int = setting(0, "port of /health and /metrics (0 picks a free port)")
    max_body_bytes: int = setting(
        64 * 1024 * 1024, "largest HTTP request body accepted (larger gets 413)"
    )
    http_idle_timeout_s: float = setting(
        30.0, "an HTTP connection idle this long, or still sending its request headers, is closed"
    )
    lease_ttl_s: int = setting(
        5, "etcd lease TTL: a dead instance leaves the registry within this time"
    )
    telemetry_period_s: float = setting(0.2, "interval of InstanceLoad telemetry on NATS")
    nats_reconnect_buffer_bytes: int = setting(
        2 << 20,
        "what is held for NATS while the connection is down, sent once it is back; past it, "
        "messages are not sent (telemetry goes out next period, token chunks are asked for again)",
    )
    connect_timeout_s: float = setting(
        10.0, "how long to keep retrying NATS and etcd at start before exiting"
    )
    stop_timeout_s: float = setting(
        45.0,
        "on SIGTERM, the longest the whole stop may take (accepted work finishing, leaving the "
        "registry, closing connections); past it the process logs every thread's stack and exits",
    )
    log_level: str = setting("INFO", "log level")
    log_format: str = setting("json", "log format: json or text")

    def validate(self) -> None:
        if self.nats_reconnect_buffer_bytes < 1:
            raise ConfigError(
                f"nats_reconnect_buffer_bytes must be >= 1, got {self.nats_reconnect_buffer_bytes}"
            )
        if self.lease_ttl_s < 1:
            raise ConfigError(f"lease_ttl_s must be >= 1, got {self.lease_ttl_s}")
        if not 0.01 <= self.telemetry_period_s <= 10:
            raise ConfigError(
                f"telemetry_period_s must be in [0.01, 10], got {self.telemetry_period_s}"
            )
        if self.log_format not in ("json", "text"):
            raise ConfigError(f"log_format must be json or text, got {self.log_format!r}")
        if self.http_idle_timeout_s <= 0:
            raise ConfigError(f"http_idle_timeout_s must be > 0, got {self.http_idle_timeout_s}")
        if self.connect_timeout_s <= 0:
            raise ConfigError(f"connect_timeout_s must be > 0, got {self.connect_timeout_s}")
        if self.stop_timeout_s <= 0:
            raise ConfigError(f"stop_timeout_s must be > 0, got {self.stop_timeout_s}")
