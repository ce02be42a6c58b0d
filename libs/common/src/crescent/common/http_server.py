"""The aiohttp server every service runs, with errors that are JSON and logged once.

aiohttp answers some requests before any handler or middleware sees them: a request line or
header block it cannot parse or that is over its limits gets a plain-text 400 from the
protocol itself, an Expect header it does not know a plain-text 417, and an exception that
escapes the application a plain-text 500. Here those answers have the OpenAI error shape the
API uses everywhere else, and each is logged once as the client's fault (4xx) or the server's
(5xx). Idle connections, and clients that send their headers too slowly, are closed after
`idle_timeout_s` (aiohttp's keep-alive timer runs from the moment a connection opens and again
after each response).
"""

from __future__ import annotations

import logging
from http import HTTPStatus

from aiohttp import hdrs, web
from aiohttp.http_exceptions import HttpProcessingError

log = logging.getLogger(__name__)

# After answering a request whose body was not read to the end (a 408, a 413), the rest of it
# is read and dropped for at most this long before the connection closes, so that the client
# reads the answer instead of a connection reset (aiohttp's default is 10 s).
LINGER_S = 2.0


def error_body(status: int, message: str) -> dict:
    """OpenAI's error shape for an answer no handler wrote."""
    kind = "invalid_request_error" if status < 500 else "server_error"
    return {"error": {"message": message, "type": kind, "param": None, "code": None}}


class _JsonErrorProtocol(web.RequestHandler):
    """aiohttp's connection handler with JSON error answers."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            # A streamed response had begun: nothing can be sent now but the end of the
            # connection. Whoever let the exception through has logged it.
            raise ConnectionError("the response had begun when the request failed")
        if status >= 500:
            message = f"{status} {HTTPStatus(status).phrase}: the server failed; see its log"
            log.error("request failed", extra={"status": status, "cause": repr(exc)}, exc_info=exc)
        else:
            message = message or HTTPStatus(status).phrase
            log.info("request refused", extra={"status": status, "cause": message})
        response = web.json_response(error_body(status, message), status=status)
        response.force_close()
        return response

    async def finish_response(
        self, request: web.BaseRequest, resp: web.StreamResponse, start_time: float | None
    ) -> tuple[web.StreamResponse, bool]:
        """An HTTP error raised where no middleware catches it (aiohttp's answer to an Expect
        header it does not know, a 404 of a service without the conductor's middleware) is
        plain text; it leaves as JSON instead, logged here."""
        if isinstance(resp, web.HTTPException) and resp.status >= 400:
            message = resp.text or resp.reason
            log.info(
                "request refused",
                extra={"status": resp.status, "path": request.path, "cause": message},
            )
            kept = {
                name: value
                for name, value in resp.headers.items()
                if name not in (hdrs.CONTENT_TYPE, hdrs.CONTENT_LENGTH)
            }
            resp = web.json_response(
                error_body(resp.status, message), status=resp.status, headers=kept
            )
        return await super().finish_response(request, resp, start_time)

    def log_exception(self, *args, **kwargs) -> None:
        """A body that fails to decompress was answered with a 400 already; when aiohttp then
        drains the rest of it and meets the same error, that is no server fault."""
        if isinstance(kwargs.get("exc_info"), HttpProcessingError | web.RequestPayloadError):
            self.logger.debug(*args, **kwargs)
            return
        super().log_exception(*args, **kwargs)


class _JsonErrorServer(web.Server):
    def __call__(self) -> web.RequestHandler:
        return _JsonErrorProtocol(self, loop=self._loop, **self._kwargs)


class JsonErrorRunner(web.AppRunner):
    """An AppRunner whose connections answer protocol-level errors with JSON."""

    def __init__(
        self, app: web.Application, idle_timeout_s: float, shutdown_timeout_s: float = 60.0
    ) -> None:
        super().__init__(
            app,
            shutdown_timeout=shutdown_timeout_s,
            access_log=None,
            handler_cancellation=True,
            keepalive_timeout=idle_timeout_s,
            lingering_time=LINGER_S,
        )

    async def _make_server(self) -> web.Server:
        # The application's own server, rebuilt with the same handler, factory and settings
        # so that its connections use _JsonErrorProtocol.
        server = await super()._make_server()
        return _JsonErrorServer(
            server.request_handler,
            request_factory=server.request_factory,
            handler_cancellation=server.handler_cancellation,
            loop=server._loop,
            **server._kwargs,
        )
