"""MessagePack wire codec: typed messages that validate on decode and carry a version.

Every message is a msgspec Struct tagged with its class name, so a reply that may be either
a result or an ErrorReply decodes through a Union of the two without guessing.
"""

from __future__ import annotations

import functools
from typing import Any, TypeVar

import msgspec

from crescent.common.errors import MessageError, UnknownVersionError

PROTOCOL_VERSION = 1

M = TypeVar("M")


class Message(msgspec.Struct, tag=True, kw_only=True, omit_defaults=True):
    """Base of every control-plane message; `v` is the protocol version."""

    v: int = PROTOCOL_VERSION


class _VersionOnly(msgspec.Struct):
    v: Any = None


_encoder = msgspec.msgpack.Encoder()


@functools.cache
def _decoder(message_type: Any) -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(message_type)


@functools.cache
def _version_decoder() -> msgspec.msgpack.Decoder:
    return msgspec.msgpack.Decoder(_VersionOnly)


def _type_name(message_type: Any) -> str:
    return getattr(message_type, "__name__", None) or str(message_type)


def encode(message: Message) -> bytes:
    return _encoder.encode(message)


def _peek_version(data: bytes) -> Any:
    try:
        return _version_decoder().decode(data).v
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None


def decode(data: bytes, message_type: type[M] | Any) -> M:
    """Decode `data` as `message_type` (a Message class or a Union of them).

    Raises UnknownVersionError for a body from another protocol version and MessageError for
    anything else that does not match, so a service can answer with an error and go on.
    """
    try:
        message = _decoder(message_type).decode(data)
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        version = _peek_version(data)
        if version is not None and version != PROTOCOL_VERSION:
            raise UnknownVersionError(_type_name(message_type), version, PROTOCOL_VERSION) from exc
        raise MessageError(_type_name(message_type), str(exc)) from exc
    if message.v != PROTOCOL_VERSION:
        raise UnknownVersionError(_type_name(message_type), message.v, PROTOCOL_VERSION)
    return message
