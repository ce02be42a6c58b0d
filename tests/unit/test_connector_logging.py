"""The connector's warnings from an engine core child process: logged as the worker logs."""

from __future__ import annotations

import json
import logging

import pytest

from crescent.engine.vllm.connector import log_like_the_worker
from crescent.engine.vllm.plan import ConnectorConfig


def _config(**fields) -> ConnectorConfig:
    return ConnectorConfig(
        nats_url="nats://x", etcd_url="http://x", cluster="c", node="n", model="m",
        block_size=64, **fields,
    )  # fmt: skip


@pytest.fixture
def root_logger():
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    try:
        yield root
    finally:
        root.handlers[:] = handlers
        root.setLevel(level)


def test_a_process_without_handlers_logs_json_lines_with_the_warnings_fields(root_logger, capsys):
    root_logger.handlers[:] = []
    log_like_the_worker(_config(role="decode", instance_id="decode-7"))
    logging.getLogger("crescent.engine.vllm.saver").warning(
        "KV commit failed", extra={"error": "ConnectionLostError()"}
    )
    line = json.loads(capsys.readouterr().err.strip().splitlines()[-1])
    assert line["msg"] == "KV commit failed"
    assert line["error"] == "ConnectionLostError()"
    assert (line["service"], line["instance"], line["level"]) == ("decode", "decode-7", "warning")
    assert line["ts"] > 0


def test_a_process_that_set_up_its_logging_keeps_it(root_logger):
    handler = logging.NullHandler()
    root_logger.handlers[:] = [handler]
    log_like_the_worker(_config(instance_id="prefill-1"))
    assert root_logger.handlers == [handler]
