"""Fixtures shared by every test: real nats-server and etcd processes on free loopback ports."""

from __future__ import annotations

import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from crescent.cluster.infra import etcd_spec, nats_spec
from crescent.cluster.processes import ManagedProcess
from crescent.common.ports import free_port


@dataclass
class Infra:
    nats: ManagedProcess
    etcd: ManagedProcess
    nats_url: str
    etcd_url: str


def start_process(spec, log_dir: Path) -> ManagedProcess:
    process = ManagedProcess(spec, log_dir)
    process.start()
    process.wait_ready(30)
    return process


@pytest.fixture
def infra(tmp_path: Path) -> Iterator[Infra]:
    """A fresh NATS and etcd for one test, so a test may stop or restart either."""
    nats_port, etcd_port = free_port(), free_port()
    nats = start_process(nats_spec(nats_port), tmp_path / "logs")
    etcd = start_process(etcd_spec(etcd_port, tmp_path / "etcd-data"), tmp_path / "logs")
    try:
        yield Infra(nats, etcd, f"nats://127.0.0.1:{nats_port}", f"http://127.0.0.1:{etcd_port}")
    finally:
        etcd.stop()
        nats.stop()


@pytest.fixture
def cluster_name() -> str:
    return "t" + secrets.token_hex(4)


def pytest_sessionfinish(session, exitstatus):
    """Tests SIGKILL processes on purpose; free the shared memory those leave behind."""
    from crescent.transfer import sweep_orphans

    sweep_orphans()
