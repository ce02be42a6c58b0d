"""How a request's trip can fail, and which failures move it to another instance rather than
fail it (flow.py decides; generation.py turns the rest into HTTP answers)."""

from __future__ import annotations

from crescent.common.errors import (
    ConnectionLostError,
    NoRespondersError,
    RecoverableError,
    RemoteError,
)
from crescent.common.messages import REPLY_TOO_LARGE
from crescent.conductor.policy import Rejection


class RejectedError(RecoverableError):
    """Admission turned the request away before any prefill ran."""

    def __init__(self, rejection: Rejection) -> None:
        super().__init__(rejection.detail)
        self.rejection = rejection


class InstanceLostError(RecoverableError):
    """The instance serving a request left the registry while the request waited on it."""


class StreamBrokenError(RecoverableError):
    """The decode token stream lost a chunk or reported an error."""


class RequestRefusedError(RecoverableError):
    """An engine refused the request's parameters (InvalidRequestError): the client's to fix."""


class UnsendableReplyError(RecoverableError):
    """An instance's reply to the request was too large for one NATS message."""


INVALID_REQUEST = "InvalidRequestError"  # the code of an engine's refusal (crescent.engine.base)
START_REFUSED = "StartRefused"  # a decode's refusal to admit a start (DecodeStart.admit)
JOB_RUNNING = "JobRunning"  # a prefill job asked about again is not done yet (PrefillResultAsk)
JOB_UNKNOWN = "JobUnknown"  # a prefill job asked about again is not known there (or cancelled)


MOVABLE_ERRORS = (
    InstanceLostError,
    ConnectionLostError,
    StreamBrokenError,
    NoRespondersError,
    RemoteError,
)
"""Failures after which a request is moved to another instance rather than failed."""


def not_to_move(exc: Exception) -> RecoverableError | None:
    """The error to fail a request with where any instance would answer it as this one did
    (its engine refused the parameters; its reply was too large to send), so a move would only
    repeat the failure and mark a healthy instance gone; None where moving it may help."""
    if isinstance(exc, RemoteError):
        if exc.code == INVALID_REQUEST:
            return RequestRefusedError(exc.message)
        if exc.code == REPLY_TOO_LARGE:
            return UnsendableReplyError(str(exc))
    return None
