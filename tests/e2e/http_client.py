"""A raw HTTP/1.1 client for tests that must send what well-behaved clients never do: bytes
that are not JSON, any header, bodies that arrive slowly or never."""

from __future__ import annotations

import http.client
import json
import socket
from dataclasses import dataclass

TIMEOUT_S = 30.0


@dataclass
class Answer:
    status: int
    headers: dict[str, str]
    body: bytes

    def error(self) -> dict:
        """The OpenAI error object of a non-2xx answer; fails the test if there is none."""
        assert self.headers.get("content-type", "").startswith("application/json"), (
            f"{self.status} with Content-Type {self.headers.get('content-type')!r}: "
            f"{self.body[:200]!r}"
        )
        error = json.loads(self.body)["error"]
        assert isinstance(error["message"], str) and error["message"], error
        assert isinstance(error["type"], str) and error["type"], error
        return error


def post(port: int, path: str, body: bytes, headers: dict[str, str] | None = None) -> Answer:
    """POST `body` as is. Content-Type is application/json unless `headers` names another
    (an empty value leaves the header out)."""
    sent = {"Content-Type": "application/json", **(headers or {})}
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT_S)
    try:
        connection.putrequest("POST", path, skip_accept_encoding=True)
        for name, value in sent.items():
            if value:
                connection.putheader(name, value)
        connection.putheader("Content-Length", str(len(body)))
        connection.endheaders(body)
        response = connection.getresponse()
        return Answer(
            response.status, {k.lower(): v for k, v in response.getheaders()}, response.read()
        )
    finally:
        connection.close()


def check_answer(answer: Answer) -> None:
    """What any request must get: no 5xx; an error is an OpenAI error body; a success is a
    whole JSON response (choices, or a Responses API output) or an SSE stream that ends with
    [DONE] (the Responses API's with its last event)."""
    assert answer.status < 500, f"{answer.status}: {answer.body[:300]!r}"
    if answer.status >= 400:
        answer.error()
    elif answer.headers.get("content-type", "").startswith("text/event-stream"):
        last_event = answer.body.rstrip().rsplit(b"\n\n", 1)[-1]
        assert last_event == b"data: [DONE]" or last_event.startswith(
            (b"event: response.completed\n", b"event: response.incomplete\n")
        ), answer.body[-200:]
    else:
        body = json.loads(answer.body)
        assert "choices" in body or (body.get("object") == "response" and "output" in body), body


def read_until_closed(sock: socket.socket, deadline_s: float) -> bytes:
    """Everything the server sends until it closes the connection; fails the test if it has not
    closed it within deadline_s."""
    sock.settimeout(deadline_s)
    received = b""
    while True:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            raise AssertionError(
                f"the server kept the connection open for {deadline_s} s; "
                f"received {received[:200]!r}"
            ) from None
        if not chunk:
            return received
        received += chunk
