"""Every metric the Grafana dashboard (deploy/grafana/dashboards/crescent.json) queries is served
on /metrics by a running emulated cluster, after a few requests: a renamed or removed metric
shows up here rather than as an empty panel in production."""

from __future__ import annotations

import asyncio
import json
import time
from pathlib import Path

import aiohttp
import promql_parser
import pytest
from prometheus_client.parser import text_string_to_metric_families

from crescent.common.codec import decode
from crescent.common.etcd import connect_etcd
from crescent.common.messages import InstanceInfo
from crescent.common.naming import Keys

pytestmark = pytest.mark.e2e
ROOT = Path(__file__).resolve().parents[2]
DASHBOARD = ROOT / "deploy/grafana/dashboards/crescent.json"
MODEL = "crescent-emulated"
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}
# Labelled metrics that have no sample until their event happens (a rejection, a replication):
# these need only be declared; every other queried metric must have a sample by now.
EVENT_METRICS = {
    "crescent_rejected_requests_total",
    "crescent_replication_orders_total",
    "crescent_store_replicated_blocks_total",
}
TICKS_DEADLINE_S = 10.0  # several telemetry periods of the dev cluster


def queried_metrics() -> set[str]:
    """Every metric a PromQL query of the dashboard selects."""
    names: set[str] = set()
    board = json.loads(DASHBOARD.read_text())
    for target in (target for panel in board["panels"] for target in panel["targets"]):
        promql_parser.walk(
            promql_parser.parse(target["expr"]),
            lambda node: (
                names.add(node.name) if isinstance(node, promql_parser.VectorSelector) else None
            ),
        )
    return names


def sampled_names(text: str) -> set[str]:
    """Names PromQL can select from one /metrics page now."""
    return {
        sample.name for family in text_string_to_metric_families(text) for sample in family.samples
    }


def declared_names(text: str) -> set[str]:
    """Names a page's metric families will produce, samples or not (a labelled family has no
    sample before its first event)."""
    return {
        family.name + suffix
        for family in text_string_to_metric_families(text)
        for suffix in SUFFIXES.get(family.type, ())
    } | sampled_names(text)


async def metrics_urls(cluster) -> dict[str, str]:
    """instance id → /metrics URL of every registered service (from the etcd registry)."""
    etcd = await connect_etcd(cluster.etcd_url)
    try:
        entries = await etcd.get_prefix(Keys(cluster.spec.cluster).instances().encode())
    finally:
        await etcd.close()
    infos = [decode(entry.value, InstanceInfo) for entry in entries]
    return {info.instance_id: f"{info.http_url}/metrics" for info in infos}


async def test_every_metric_the_dashboard_queries_is_served(dev_cluster):
    cluster = dev_cluster
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        # Longer than one 512-token block, so KV is written to the store and its bytes counted.
        body = {"model": MODEL, "prompt": "operators watch this cluster " * 60, "max_tokens": 6}
        for stream in (False, True):
            async with session.post(
                f"{cluster.api_url}/v1/completions", json={**body, "stream": stream}
            ) as response:
                assert response.status == 200, await response.text()
                await response.read()
        urls = await metrics_urls(cluster)
        assert {i.split("-")[0] for i in urls} == {"conductor", "prefill", "decode", "store"}
        # Gauges set on a service's telemetry tick (instance loads, the P/D imbalance factor)
        # have a sample from its first tick after the requests: read until all are there.
        deadline = time.monotonic() + TICKS_DEADLINE_S
        while True:
            pages = {}
            for instance_id, url in urls.items():
                async with session.get(url) as response:
                    assert response.status == 200, url
                    pages[instance_id] = await response.text()
            declared = set().union(*(declared_names(text) for text in pages.values()))
            sampled = set().union(*(sampled_names(text) for text in pages.values()))
            unsampled = queried_metrics() - EVENT_METRICS - sampled
            if not unsampled or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
    assert not queried_metrics() - declared, "the dashboard queries metrics no service serves"
    assert not unsampled, f"metrics the dashboard queries have no sample: {sorted(unsampled)}"
    prefill = next(text for instance_id, text in pages.items() if instance_id.startswith("prefill"))
    written = [
        s
        for f in text_string_to_metric_families(prefill)
        for s in f.samples
        if s.name == "crescent_kv_transfer_bytes_total" and s.labels["op"] == "write"
    ]
    assert written and sum(s.value for s in written) > 0, "the prefill's KV writes are not counted"
