"""The conductor's error middleware: every answer that is not a success leaves as an
OpenAI-style JSON body and is logged once, with its request id (once one was assigned), status
and cause, so an operator can find any failed request in the conductor's log.

Errors the client caused (4xx) are logged at info, the cluster's (5xx) at warning; an
exception nobody anticipated becomes a 500 logged with its traceback.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

from aiohttp import hdrs, web

from crescent.conductor.openai_api import ApiError

log = logging.getLogger(__name__)

_MAX_LOGGED_CAUSE = 500  # characters: a message may quote a client's input back to it
# Where a handler keeps the id it gave the request, for the log line of a failure it did not expect.
REQUEST_ID = web.RequestKey("request_id", str)


def error_response(error: ApiError) -> web.Response:
    response = web.json_response(error.body(), status=error.status, headers=error.headers)
    if error.status == 408:
        response.force_close()  # the rest of a late body must not be read as the next request
    return response


def _log_answer(request: web.Request, status: int, cause: str, request_id: str | None) -> None:
    fields = {
        "status": status,
        "method": request.method,
        "path": request.path,
        "cause": cause[:_MAX_LOGGED_CAUSE],
    }
    if request_id is not None:
        fields["request_id"] = request_id
    log.log(
        logging.WARNING if status >= 500 else logging.INFO,
        "request answered with an error",
        extra=fields,
    )


def _from_http_exception(exc: web.HTTPException) -> ApiError:
    """aiohttp's own 404/405/413…: its text says more than its reason phrase, and its headers
    (a 405's Allow) still apply."""
    kind = "not_found_error" if exc.status == 404 else "invalid_request_error"
    kept = {
        name: value
        for name, value in exc.headers.items()
        if name not in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH)
    }
    return ApiError(exc.status, exc.text or exc.reason or "error", type_=kind, headers=kept)


@web.middleware
async def openai_errors(
    request: web.Request, handler: Callable[[web.Request], Awaitable[web.StreamResponse]]
) -> web.StreamResponse:
    try:
        response = await handler(request)
    except ApiError as error:
        response = error_response(error)
        cause = error.message
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        error = _from_http_exception(exc)
        response, cause = error_response(error), error.message
    except Exception as exc:
        request_id = request.get(REQUEST_ID)
        if request.writer.output_size > 0:
            # Too late for an error body: the connection is cut, and this is its only log line.
            log.exception(
                "request failed mid-response",
                extra={"request_id": request_id, "path": request.path},
            )
            raise
        log.exception(
            "request failed",
            extra={
                "status": 500,
                "path": request.path,
                "request_id": request_id,
                "cause": repr(exc),
            },
        )
        return error_response(
            ApiError(500, "the conductor failed on this request; see its log", type_="server_error")
        )
    else:
        if response.status < 400:
            return response
        cause = response.reason
    _log_answer(request, response.status, cause, response.headers.get("X-Request-Id"))
    return response
