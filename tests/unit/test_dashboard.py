"""The Grafana dashboard (deploy/grafana) loads, is shaped as Grafana reads it, queries the
datasource that docker-compose provisions, and shows what issue 12 asks an operator to see.
That every metric it queries exists on a running cluster is tests/e2e/test_dashboard_metrics.py."""

from __future__ import annotations

import json
from pathlib import Path

import promql_parser
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
GRAFANA = ROOT / "deploy/grafana"
DASHBOARD = GRAFANA / "dashboards/crescent.json"
PANEL_TYPES = {"timeseries", "stat", "gauge", "bargauge", "table", "heatmap", "text"}
# What the dashboard must show (issue 12, item 5), each as words of a panel title.
TOPICS = [
    "request rate",
    "ttft",
    "tbt",
    "rejections",
    "cache hit rate",
    "f_im",
    "prediction error",
    "queue per instance",
    "kv use per instance",
    "transfer",
]


def metric_names(expr: str) -> set[str]:
    """The metrics a PromQL expression selects; ValueError if it does not parse."""
    names: set[str] = set()
    promql_parser.walk(
        promql_parser.parse(expr),
        lambda node: (
            names.add(node.name) if isinstance(node, promql_parser.VectorSelector) else None
        ),
    )
    return names


def dashboard() -> dict:
    return json.loads(DASHBOARD.read_text())


def datasource_uid() -> str:
    provisioned = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    [source] = provisioned["datasources"]
    assert source["type"] == "prometheus"
    return source["uid"]


def check_dashboard(board: dict, uid: str) -> list[str]:
    """Every way `board` is not a dashboard Grafana would load with working panels."""
    problems = []
    for key, kind in (("uid", str), ("title", str), ("schemaVersion", int), ("panels", list)):
        if not isinstance(board.get(key), kind):
            problems.append(f"dashboard.{key} must be a {kind.__name__}")
    if problems:
        return problems
    ids = [panel.get("id") for panel in board["panels"]]
    if len(set(ids)) != len(ids) or not all(isinstance(i, int) for i in ids):
        problems.append(f"panel ids must be unique integers: {ids}")
    cells: set[tuple[int, int]] = set()
    for panel in board["panels"]:
        name = panel.get("title") or f"panel {panel.get('id')}"
        if panel.get("type") not in PANEL_TYPES:
            problems.append(f"{name}: unknown panel type {panel.get('type')!r}")
        grid = panel.get("gridPos", {})
        if not all(isinstance(grid.get(k), int) for k in "hwxy") or grid["x"] + grid["w"] > 24:
            problems.append(f"{name}: gridPos must be integers h, w, x, y within 24 columns")
            continue
        mine = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        if mine & cells:
            problems.append(f"{name}: overlaps another panel")
        cells |= mine
        if panel.get("datasource", {}).get("uid") != uid:
            problems.append(f"{name}: datasource uid is not the provisioned {uid!r}")
        targets = panel.get("targets") or []
        if not targets:
            problems.append(f"{name}: no targets")
        if len({t.get("refId") for t in targets}) != len(targets):
            problems.append(f"{name}: refIds must be unique")
        for target in targets:
            expr = target.get("expr", "")
            if target.get("datasource", {}).get("uid") != uid:
                problems.append(f"{name}: target {target.get('refId')} queries another datasource")
            try:
                names = metric_names(expr)
            except ValueError as exc:
                problems.append(f"{name}: target {target.get('refId')} is not PromQL: {exc}")
                continue
            if not names or not all(n.startswith("crescent_") for n in names):
                problems.append(
                    f"{name}: target {target.get('refId')} must query crescent metrics only"
                )
    return problems


def test_dashboard_loads_and_passes_the_structure_check():
    assert check_dashboard(dashboard(), datasource_uid()) == []


@pytest.mark.parametrize(
    "breakage", ["datasource", "no-targets", "overlap", "no-metric", "not-promql"]
)
def test_the_structure_check_finds_a_broken_dashboard(breakage):
    board = dashboard()
    first, second = board["panels"][0], board["panels"][1]
    if breakage == "datasource":
        first["datasource"] = {"type": "prometheus", "uid": "elsewhere"}
    elif breakage == "no-targets":
        first["targets"] = []
    elif breakage == "overlap":
        second["gridPos"] = dict(first["gridPos"])
    elif breakage == "no-metric":
        first["targets"][0]["expr"] = "up"
    else:
        first["targets"][0]["expr"] = "sum(rate(crescent_requests_total[1m])"
    assert check_dashboard(board, datasource_uid())


@pytest.mark.parametrize("topic", TOPICS)
def test_dashboard_shows(topic):
    titles = [panel["title"].lower() for panel in dashboard()["panels"]]
    assert any(topic in title for title in titles), titles


def test_grafana_provisioning_finds_the_dashboard_where_compose_mounts_it():
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    mounts = dict(volume.split(":")[:2] for volume in compose["grafana"]["volumes"])
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/crescent.yml").read_text())
    [files] = provider["providers"]
    assert DASHBOARD.parent == ROOT / "deploy/grafana/dashboards"
    assert mounts["./deploy/grafana/dashboards"] == files["options"]["path"]
    assert mounts["./deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    source = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())[
        "datasources"
    ][0]
    assert source["url"] == "http://prometheus:9090" and "prometheus" in compose
