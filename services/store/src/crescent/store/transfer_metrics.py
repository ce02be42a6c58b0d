"""Per-transport data-plane counters on /metrics: what the store daemon's TransferEngine (the
only one registered here) moved, by transport, so an operator, a benchmark or a test can tell
which road the bytes really took.

    crescent_transfer_bytes_total{engine, transport, side}      side: client | served
    crescent_transfer_transfers_total{engine, transport}
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

from prometheus_client import REGISTRY
from prometheus_client.core import CounterMetricFamily
from prometheus_client.registry import Collector

from crescent.transfer import TransferEngine


class TransferCollector(Collector):
    """Reads the counters of registered engines at scrape time (nothing on the data path)."""

    def __init__(self) -> None:
        self._engines: dict[str, TransferEngine] = {}
        self._lock = threading.Lock()

    def add(self, engine: TransferEngine, name: str) -> None:
        with self._lock:
            self._engines[name] = engine

    def collect(self) -> Iterator[CounterMetricFamily]:
        moved = CounterMetricFamily(
            "crescent_transfer_bytes",
            "bytes moved on the data plane, per transport; "
            "side=client: by this engine's batches, side=served: by its server for "
            "peers' batches",
            labels=["engine", "transport", "side"],
        )
        transfers = CounterMetricFamily(
            "crescent_transfer_transfers",
            "entries (contiguous regions) moved by this engine's batches, per transport",
            labels=["engine", "transport"],
        )
        with self._lock:
            engines = dict(self._engines)
        for name, engine in engines.items():
            for kind, counters in engine.counters().items():
                moved.add_metric([name, kind.value, "client"], counters.num_bytes)
                moved.add_metric([name, kind.value, "served"], counters.num_served_bytes)
                transfers.add_metric([name, kind.value], counters.num_transfers)
        yield moved
        yield transfers


_collector: TransferCollector | None = None
_collector_lock = threading.Lock()


def register_transfer_metrics(engine: TransferEngine, name: str) -> None:
    """Put `engine`'s counters on this process's /metrics under `engine=name` (a later engine
    of the same name replaces it)."""
    global _collector
    with _collector_lock:
        if _collector is None:
            _collector = TransferCollector()
            REGISTRY.register(_collector)
    _collector.add(engine, name)
