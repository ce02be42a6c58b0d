"""Malformed HTTP input against a real conductor (issue 8, items 6 and 7).

Every malformed request gets a 4xx with an OpenAI error body and never a 5xx; each non-2xx is
logged once by the conductor; idle connections, slow headers and slow bodies are cut off.
The cluster is emulated at zero compute time with a 512-token context, so any request the
fuzz makes valid finishes at once.
"""

from __future__ import annotations

import copy
import gzip
import json
import socket
import time
import zlib

import pytest
import schemathesis
from http_client import check_answer, post, read_until_closed
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from crescent.cluster.local import ClusterSpec, LocalCluster
from crescent.common.ports import free_port
from crescent.conductor.openapi import OPENAPI

pytestmark = pytest.mark.e2e
MODEL = "crescent-emulated"
IDLE_TIMEOUT_S = 1.0
BODY_TIMEOUT_S = 1.0
MAX_BODY_BYTES = 1024 * 1024  # above the 100k-deep nesting cases
CLOSE_DEADLINE_S = 15.0  # a generous bound on a 1 s timeout, for a loaded machine
ENDPOINTS = ["/v1/completions", "/v1/chat/completions", "/v1/responses"]
FUZZ = settings(
    max_examples=150,
    deadline=None,
    database=None,
    suppress_health_check=[
        HealthCheck.too_slow,
        HealthCheck.data_too_large,
        HealthCheck.large_base_example,
    ],
)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    spec = ClusterSpec(
        workdir=tmp_path_factory.mktemp("http-input"),
        api_port=free_port(),
        engine_args=["--emulated-time-scale", "0", "--max-model-len", "512"],
        conductor_args=[
            "--http-idle-timeout-s",
            str(IDLE_TIMEOUT_S),
            "--body-timeout-s",
            str(BODY_TIMEOUT_S),
            "--max-body-bytes",
            str(MAX_BODY_BYTES),
        ],
    )
    cluster = LocalCluster(spec)
    cluster.start(timeout_s=60)
    yield cluster
    cluster.stop()


@pytest.fixture(scope="module")
def port(cluster) -> int:
    return cluster.spec.api_port


def conductor_log(cluster, name: str = "conductor-0") -> list[dict]:
    process = next(p for p in cluster.processes if p.spec.name == name)
    return [
        json.loads(line)
        for line in process.log_path.read_text().splitlines()
        if line.startswith("{")
    ]


def body(**fields) -> bytes:
    return json.dumps({"model": MODEL, "prompt": "hi", "max_tokens": 2, **fields}).encode()


def chat_body(**fields) -> bytes:
    return json.dumps(
        {"model": MODEL, "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, **fields}
    ).encode()


# The issue's probe: each of these was a 500 text/plain.
ISSUE_CASES = {
    "seed 1e30": (b'{"model": "crescent-emulated", "prompt": "hi", "seed": 1e30}', {}, 400),
    "seed 10**30": (body(seed=10**30), {}, 400),
    "seed 2**64": (body(seed=2**64), {}, 400),
    "temperature 1e400": (
        b'{"model": "crescent-emulated", "prompt": "hi", "temperature": 1e400}',
        {},
        400,
    ),
    "temperature 10**400": (body(temperature=10**400), {}, 400),
    "integer of 5000 digits": (
        b'{"model": "crescent-emulated", "prompt": "hi", "max_tokens": 1' + b"0" * 5000 + b"}",
        {},
        400,
    ),
    "lone surrogate in the prompt": (
        b'{"model": "crescent-emulated", "prompt": "hi \\ud800 there"}',
        {},
        400,
    ),
    "lone surrogate in a message": (
        chat_body(messages=[{"role": "user", "content": "\udfff"}]),
        {},
        400,
    ),
    "invalid UTF-8": (b'{"model": "crescent-emulated", "prompt": "hi \xff\xfe"}', {}, 400),
    "NaN literal": (b'{"model": "crescent-emulated", "prompt": "hi", "top_p": NaN}', {}, 400),
    "Infinity literal": (
        b'{"model": "crescent-emulated", "prompt": "hi", "temperature": -Infinity}',
        {},
        400,
    ),
    "JSON nested 100k deep": (b"[" * 100_000 + b"]" * 100_000, {}, 400),
    "objects nested 100k deep": (b'{"a":' * 100_000 + b"1" + b"}" * 100_000, {}, 400),
    "garbage gzip": (b"\x1f\x8b\x08\x00garbage", {"Content-Encoding": "gzip"}, 400),
    "garbage deflate": (b"not deflate at all", {"Content-Encoding": "deflate"}, 400),
    "unknown Content-Encoding": (body(), {"Content-Encoding": "zork"}, 415),
    "unknown charset": (body(), {"Content-Type": "application/json; charset=zork"}, 415),
    "non-UTF-8 charset": (body(), {"Content-Type": "application/json; charset=latin-1"}, 415),
    "text/plain": (body(), {"Content-Type": "text/plain"}, 415),
    "form-encoded": (
        b"model=x&prompt=y",
        {"Content-Type": "application/x-www-form-urlencoded"},
        415,
    ),
    "empty body": (b"", {}, 400),
    "oversize header": (body(), {"X-Padding": "a" * 20_000}, 400),
    "oversize body": (body(prompt="x" * 2 * MAX_BODY_BYTES), {}, 413),
    "oversize once decompressed": (
        gzip.compress(body(prompt="x" * 2 * MAX_BODY_BYTES)),
        {"Content-Encoding": "gzip"},
        413,
    ),
    "unknown Expect": (body(), {"Expect": "nonsense"}, 417),
}


@pytest.mark.parametrize("path", ENDPOINTS)
@pytest.mark.parametrize("case", list(ISSUE_CASES))
def test_malformed_bodies_of_the_issue_get_a_4xx_openai_error(port, path, case):
    payload, headers, status = ISSUE_CASES[case]
    answer = post(port, path, payload, headers)
    assert answer.status == status, f"{case}: {answer.status} {answer.body[:300]!r}"
    answer.error()


def test_compressed_bodies_are_read(port):
    for encoding, packed in (("gzip", gzip.compress(body())), ("deflate", zlib.compress(body()))):
        answer = post(port, "/v1/completions", packed, {"Content-Encoding": encoding})
        assert answer.status == 200, (encoding, answer.body)


def test_well_formed_requests_still_succeed(port):
    assert post(port, "/v1/completions", body(seed=2**63 - 1, temperature=0)).status == 200
    assert (
        post(
            port,
            "/v1/chat/completions",
            chat_body(seed=-(2**63)),
            {"Content-Type": "application/json; charset=UTF-8"},
        ).status
        == 200
    )
    assert post(port, "/v1/completions", body(), {"Content-Type": ""}).status == 200


def test_openapi_document_describes_the_endpoints(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(b"GET /openapi.json HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        raw = read_until_closed(sock, CLOSE_DEADLINE_S)
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200")
    document = json.loads(payload)
    assert document == json.loads(json.dumps(OPENAPI))
    assert {"/v1/completions", "/v1/chat/completions", "/v1/responses", "/v1/models"} <= set(
        document["paths"]
    )
    for path in ENDPOINTS:  # what the fuzz below narrows, as the document states it
        body = document["paths"][path]["post"]["requestBody"]["content"]["application/json"]
        assert body["schema"]["properties"]["model"]["type"] == "string"


# --- property-based fuzz -------------------------------------------------------------------------

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.integers(min_value=-(10**400), max_value=10**400)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=40),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=8), children, max_size=4)
    ),
    max_leaves=12,
)
# Text with lone surrogates: escaped in ASCII JSON they decode to strings UTF-8 cannot encode.
surrogate_text = st.text(
    st.characters(categories=["Cs"]) | st.characters(), min_size=1, max_size=10
)
# Values a field plausibly holds, so that a fuzzed request often gets past the first check.
plausible = {
    "model": st.just(MODEL) | st.text(max_size=8),
    "prompt": st.text(min_size=1, max_size=20) | st.lists(st.integers(-1, 300), max_size=5),
    "messages": st.lists(
        st.fixed_dictionaries(
            {"role": st.sampled_from(["user", "system", "wizard"]), "content": st.text(max_size=20)}
        ),
        max_size=3,
    ),
    "max_tokens": st.integers(-1, 8),
    "max_completion_tokens": st.integers(-1, 8),
    "temperature": st.floats(-1, 3),
    "top_p": st.floats(-0.5, 1.5),
    "seed": st.integers(-(2**64), 2**64),
    "stop": st.text(max_size=3) | st.lists(st.text(max_size=3), max_size=3),
    "n": st.integers(0, 2),
    "stream": st.booleans(),
    "stream_options": st.fixed_dictionaries({"include_usage": st.booleans()}),
    "ignore_eos": st.booleans(),
    "input": st.text(max_size=20)
    | st.lists(
        st.fixed_dictionaries(
            {
                "role": st.sampled_from(["user", "assistant", "tool"]),
                "content": st.text(max_size=10)
                | st.lists(
                    st.fixed_dictionaries(
                        {
                            "type": st.sampled_from(["input_text", "input_image"]),
                            "text": st.text(max_size=5),
                        }
                    ),
                    max_size=2,
                ),
            }
        ),
        max_size=2,
    ),
    "echo": st.booleans(),
    "logprobs": st.booleans() | st.integers(-1, 25),
    "top_logprobs": st.integers(-1, 25),
    "presence_penalty": st.floats(-3, 3),
    "top_k": st.integers(-3, 2000),
    "logit_bias": st.dictionaries(
        st.sampled_from(["0", "97", "300", "-1", "x"]), st.floats(-200, 200), max_size=2
    ),
    "response_format": st.fixed_dictionaries(
        {"type": st.sampled_from(["text", "json_object", "json_schema"])},
        optional={"json_schema": json_values},
    ),
    "tools": st.lists(
        st.fixed_dictionaries(
            {
                "type": st.just("function"),
                "function": st.fixed_dictionaries(
                    {"name": st.text(max_size=6)}, optional={"parameters": json_values}
                ),
            }
        ),
        max_size=2,
    ),
    "tool_choice": st.sampled_from(["none", "auto", "required", "other"]) | json_values,
}
# A valid request for any endpoint (each ignores the others' prompt fields)...
VALID = {
    "model": MODEL,
    "prompt": "hello",
    "messages": [{"role": "user", "content": "hello"}],
    "input": "hello",
    "max_tokens": 4,
}
# ...with up to three fields replaced by plausible or arbitrary values, and some removed.
field_values = st.sampled_from(sorted(plausible)).flatmap(
    lambda name: st.tuples(st.just(name), plausible[name] | json_values)
)
mutated_bodies = st.builds(
    lambda replaced, removed: {
        k: v for k, v in {**VALID, **dict(replaced)}.items() if k not in removed
    },
    st.lists(field_values, max_size=3),
    st.just(set()) | st.sets(st.sampled_from(sorted(VALID)), max_size=1),
)
surrogate_bodies = st.builds(
    lambda name, text: {
        **VALID,
        name: text if name != "messages" else [{"role": "user", "content": text}],
    },
    st.sampled_from(["model", "prompt", "stop", "messages"]),
    surrogate_text,
)
request_bodies = (
    mutated_bodies
    | surrogate_bodies
    | st.dictionaries(st.text(max_size=8), json_values, max_size=4)
)


def encode(value, how: str) -> bytes:
    """JSON text as a client might send it: escaped ASCII, or raw UTF-8 where a lone
    surrogate becomes bytes that are not UTF-8 at all."""
    if how == "ascii":
        return json.dumps(value).encode()
    return json.dumps(value, ensure_ascii=False).encode("utf-8", "surrogatepass")


@FUZZ
@given(
    path=st.sampled_from(ENDPOINTS),
    value=request_bodies | json_values,
    how=st.sampled_from(["ascii", "utf-8"]),
)
def test_fuzzed_json_fields_never_make_a_5xx(port, path, value, how):
    check_answer(post(port, path, encode(value, how)))


header_token = st.text(
    st.sampled_from("abcdefghijklmnopqrstuvwxyz-0123456789"), min_size=1, max_size=12
)
header_value = st.text(st.characters(min_codepoint=0x20, max_codepoint=0x7E), max_size=64)
weird_headers = st.fixed_dictionaries(
    {},
    optional={
        "Content-Type": st.sampled_from(
            [
                "",
                "application/json",
                "application/json; charset=utf-8",
                "application/json; charset=utf-16",
                "application/json; charset=",
                "application/vnd.api+json",
                "text/plain",
                "multipart/form-data",
                'application/json; charset="utf-8"; q=1',
            ]
        )
        | header_value,
        "Content-Encoding": st.sampled_from(
            ["gzip", "deflate", "br", "zstd", "identity", "gzip, gzip", "GZIP"]
        )
        | header_value,
        "Accept": header_value,
        "Transfer-Encoding": st.sampled_from(["identity", "gzip"]),
        "Expect": st.sampled_from(["100-continue", "nonsense"]),
        "X-Fuzz": st.text(
            st.characters(min_codepoint=0x21, max_codepoint=0x7E), min_size=8000, max_size=9000
        ),
    },
).flatmap(
    lambda fixed: st.dictionaries(
        header_token.map(lambda name: "X-" + name), header_value, max_size=4
    ).map(lambda extra: {**fixed, **extra})
)
raw_bodies = st.one_of(
    st.binary(max_size=512),
    request_bodies.map(lambda value: json.dumps(value).encode()),
    request_bodies.map(lambda value: gzip.compress(json.dumps(value).encode())),
    st.integers(1, 200_000).map(lambda depth: b"[" * depth + b"]" * depth),
    st.binary(max_size=64).map(lambda junk: b"\x1f\x8b\x08\x00" + junk),
)


@FUZZ
@given(path=st.sampled_from(ENDPOINTS), payload=raw_bodies, headers=weird_headers)
def test_fuzzed_bytes_and_headers_never_make_a_5xx(port, path, payload, headers):
    check_answer(post(port, path, payload, headers))


# --- schemathesis: requests generated from /openapi.json, valid and not ------------------------


def _narrowed(document: dict) -> dict:
    """The conductor's document with `model` (in the bodies and the models path) narrowed to
    the model this cluster serves, so that valid cases reach the cluster instead of stopping at
    404."""
    document = copy.deepcopy(document)
    for path in ENDPOINTS:
        schema = document["paths"][path]["post"]["requestBody"]["content"]["application/json"][
            "schema"
        ]
        schema["properties"]["model"] = {"type": "string", "enum": [MODEL]}
    model_path = document["paths"]["/v1/models/{model}"]["get"]["parameters"][0]
    model_path["schema"] = {"type": "string", "enum": [MODEL]}
    return document


# Loaded from the module, not fetched: schemathesis's pytest fixture loader does not work with
# this pytest; test_openapi_document_describes_the_endpoints checks the served one is the same.
openapi_schema = schemathesis.openapi.from_dict(_narrowed(OPENAPI))
openapi_schema.config.generation.update(modes=["positive", "negative"], max_examples=50)
# The document cannot state the vocabulary or the context length: a valid request may still be
# refused with 400 for those.
openapi_schema.config.checks.positive_data_acceptance.expected_statuses = ["2xx", "400"]


@openapi_schema.parametrize()
def test_schemathesis_finds_no_5xx_and_answers_match_the_document(case, cluster):
    case.call_and_validate(base_url=cluster.api_url)


# --- item 7: every non-2xx is logged once ---------------------------------------------------------


def test_each_error_answer_is_logged_once_with_status_and_cause(cluster, port):
    marker = f"no-such-model-{time.monotonic_ns()}"
    answer = post(port, "/v1/completions", json.dumps({"model": marker, "prompt": "x"}).encode())
    assert answer.status == 404
    header_answer = post(port, "/v1/completions", body(), {"X-Padding": marker + "b" * 20_000})
    assert header_answer.status == 400
    deadline = time.monotonic() + CLOSE_DEADLINE_S
    while True:
        lines = conductor_log(cluster)
        logged = [
            line for line in lines if marker in line.get("cause", "") and line.get("status") == 404
        ]
        refused = [
            line for line in lines if marker in line.get("cause", "") and line.get("status") == 400
        ]
        if logged and refused:
            break
        assert time.monotonic() < deadline, "the error answers were not logged"
        time.sleep(0.1)
    assert (
        len(logged) == 1 and logged[0]["status"] == 404 and logged[0]["path"] == "/v1/completions"
    )
    assert len(refused) == 1


def test_an_error_after_the_request_id_is_assigned_is_logged_with_it(cluster):
    """A conductor whose decode reservations cannot be answered in time rejects every request
    after placing it. (Its SLOs must be the cluster's: a conductor whose flags contradict the
    cluster config refuses to start.)"""
    spec = cluster.conductor_spec("conductor-strict", free_port())
    spec.argv += ["--reserve-timeout-s", "1e-9"]
    process = cluster.add_process(spec)
    process.wait_ready(30)
    deadline = time.monotonic() + 30
    while (
        answer := post(spec.port, "/v1/completions", body())
    ).status == 404:  # workers not seen yet
        assert time.monotonic() < deadline, "the strict conductor never saw the model"
        time.sleep(0.2)
    assert answer.status >= 400
    request_id = answer.headers["x-request-id"]
    answer.error()
    deadline = time.monotonic() + CLOSE_DEADLINE_S
    while not (
        logged := [
            line
            for line in conductor_log(cluster, "conductor-strict")
            if line.get("request_id") == request_id
        ]
    ):
        assert time.monotonic() < deadline, f"{request_id} was not logged"
        time.sleep(0.1)
    assert len(logged) == 1
    assert logged[0]["status"] == answer.status and logged[0]["cause"]


# --- idle and slow clients ------------------------------------------------------------------------


def test_idle_connection_is_closed(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        assert read_until_closed(sock, CLOSE_DEADLINE_S) == b""


def test_connection_sending_headers_slowly_is_closed(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        )
        assert read_until_closed(sock, CLOSE_DEADLINE_S) == b""


def test_body_that_does_not_arrive_in_time_gets_408_and_the_connection_closes(port):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b'Content-Length: 1000\r\n\r\n{"model": '
        )
        raw = read_until_closed(sock, CLOSE_DEADLINE_S)
    head, _, payload = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), raw[:300]
    assert json.loads(payload)["error"]["code"] == "request_timeout"
