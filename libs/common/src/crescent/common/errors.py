"""One root error for all of crescent.common, split into what a caller may retry and what it may
not."""

from __future__ import annotations

import asyncio


class CrescentError(Exception):
    """Root of every error Crescent raises on purpose."""


class RecoverableError(CrescentError):
    """The operation failed but the service is healthy: retry, pick another instance, or report."""


class FatalError(CrescentError):
    """The process cannot go on (bad configuration, unreachable infrastructure at start)."""


class MessageError(RecoverableError):
    """A wire body did not decode into the expected message type."""

    def __init__(self, type_name: str, reason: str) -> None:
        super().__init__(f"malformed {type_name}: {reason}")
        self.type_name = type_name
        self.reason = reason


class UnknownVersionError(MessageError):
    """A body carries a protocol version this build does not speak."""

    def __init__(self, type_name: str, version: object, supported: int) -> None:
        super().__init__(type_name, f"unknown version {version!r} (this build speaks v{supported})")
        self.version = version
        self.supported = supported


class RequestTimeoutError(RecoverableError, asyncio.TimeoutError):
    """A request got no reply before its deadline (also an asyncio.TimeoutError)."""

    def __init__(self, subject: str, timeout_s: float) -> None:
        super().__init__(f"no reply on {subject} within {timeout_s:.3f}s")
        self.subject = subject
        self.timeout_s = timeout_s


class NoRespondersError(RecoverableError):
    """Nobody listens on a subject: the instance behind it is gone."""

    def __init__(self, subject: str) -> None:
        super().__init__(f"no responders on {subject}")
        self.subject = subject


class ConnectionLostError(RecoverableError):
    """The NATS connection dropped while a reply or chunk was due: it may have been lost, and
    nobody knows whether the request was received."""


class RemoteError(RecoverableError):
    """The peer answered with an ErrorReply."""

    def __init__(self, subject: str, code: str, message: str) -> None:
        super().__init__(f"{subject}: {code}: {message}")
        self.subject = subject
        self.code = code
        self.message = message


class ConfigError(FatalError):
    """A setting has a value that cannot be used."""


class UnreachableError(FatalError):
    """A dependency (NATS, etcd) could not be reached within the start-up deadline."""

    def __init__(self, what: str, where: str, attempts: int, last_error: str) -> None:
        super().__init__(f"cannot reach {what} at {where} after {attempts} attempts: {last_error}")
        self.what = what
        self.where = where
        self.attempts = attempts
