"""Reading a request's JSON body: every way a body can be malformed ends as an ApiError (4xx).

The body is read under a deadline, so a client that sends it slowly holds a connection only
that long. It is decoded by msgspec, which rejects what the standard library lets through and
that would fail later, deep in the cluster: lone UTF-16 surrogates (no UTF-8 encoder takes
them), NaN and Infinity literals, numbers that overflow a float, integers of more than 4300
digits. Nesting too deep for the decoder is a RecursionError, caught here as well. Integers
the cluster cannot carry (beyond 64 bits) are openai_api's to refuse, field by field.
"""

from __future__ import annotations

import asyncio
from typing import Any

import msgspec
from aiohttp import hdrs, web

from crescent.conductor.openai_api import ApiError, bad_request

# Encodings aiohttp's parser undoes by itself; any other would reach the decoder still encoded.
_CONTENT_ENCODINGS = frozenset({"", "identity", "gzip", "x-gzip", "deflate"})
_CHARSETS = frozenset({"utf-8", "utf8", "us-ascii", "ascii"})


def _unsupported(message: str) -> ApiError:
    return ApiError(415, message, code="unsupported_media_type")


def check_headers(request: web.Request) -> None:
    """Refuse bodies this API cannot read before reading them: JSON in UTF-8, plainly or
    gzip/deflate encoded. A missing Content-Type is taken as JSON (the body must still parse)."""
    if hdrs.CONTENT_TYPE in request.headers:
        mime_type = request.content_type
        if not (
            mime_type == "application/json"
            or (mime_type.startswith("application/") and mime_type.endswith("+json"))
        ):
            raise _unsupported(f"Content-Type must be application/json, got {mime_type!r}")
        charset = request.charset
        if charset is not None and charset.lower() not in _CHARSETS:
            raise _unsupported(f"the body must be UTF-8 JSON; charset {charset!r} is not supported")
    encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
    if encoding not in _CONTENT_ENCODINGS:
        raise _unsupported(
            f"Content-Encoding {encoding!r} is not supported (use gzip, deflate or none)"
        )


async def read_body(request: web.Request, timeout_s: float) -> bytes:
    """The whole body, or 408 when it has not arrived within timeout_s; a body that does not
    decompress is 400, one over the size limit 413 (aiohttp's HTTPRequestEntityTooLarge)."""
    try:
        async with asyncio.timeout(timeout_s):
            return await request.read()
    except TimeoutError as exc:
        raise ApiError(
            408, f"the request body did not arrive within {timeout_s:g} s", code="request_timeout"
        ) from exc
    except web.HTTPRequestEntityTooLarge as exc:
        raise ApiError(
            413,
            f"the request body exceeds the limit of {request.client_max_size} bytes",
            code="request_too_large",
        ) from exc
    except web.RequestPayloadError as exc:
        encoding = request.headers.get(hdrs.CONTENT_ENCODING, "").strip().lower()
        cause = _cause(exc)
        if encoding:
            cause = f"it is not valid {encoding} data ({cause})"
        raise bad_request(f"the request body cannot be read: {cause}") from exc


def _cause(exc: BaseException) -> str:
    """The innermost reason of a chained error: aiohttp wraps a decompression error in a
    payload error whose own message is empty."""
    while exc.__cause__ is not None:
        exc = exc.__cause__
    return getattr(exc, "message", "") or str(exc).strip() or type(exc).__name__


def parse_json(body: bytes) -> Any:
    """A JSON value from UTF-8 bytes, or a 400 that says what is wrong with them."""
    if not body.strip():
        raise bad_request("the request body is empty; send a JSON object")
    try:
        return msgspec.json.decode(body)
    except UnicodeDecodeError as exc:
        raise bad_request(f"the body is not valid UTF-8: {exc.reason} at byte {exc.start}") from exc
    except (msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise bad_request(f"the body is not valid JSON: {exc}") from exc
    except RecursionError as exc:
        raise bad_request("the body's JSON is nested too deeply") from exc


async def read_json(request: web.Request, timeout_s: float) -> Any:
    """The parsed JSON body of `request`, read within timeout_s."""
    check_headers(request)
    return parse_json(await read_body(request, timeout_s))
