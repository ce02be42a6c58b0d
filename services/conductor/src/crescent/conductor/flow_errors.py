"""How a request's trip can fail, and which failures move it to another instance rather than
fail it (flow.py decides; generation.py turns the rest into HTTP answers)."""

from __future__ import annotations

from crescent.common.errors import (
    ConnectionLostError,
    NoRespondersError,
    RecoverableError,
    RemoteError,
)
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
