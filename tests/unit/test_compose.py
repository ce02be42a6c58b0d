"""docker-compose.yml describes the dev topology and is valid, checked offline."""

import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from distributions import missing_crescent_requirements

ROOT = Path(__file__).resolve().parents[2]
COMPOSE = ROOT / "docker-compose.yml"
INFRA = {"nats", "etcd", "jaeger", "prometheus", "grafana"}
CRESCENT = {"store", "conductor", "prefill-0", "prefill-1", "decode-0", "decode-1"}
EXPECTED = INFRA | CRESCENT


def services():
    return yaml.safe_load(COMPOSE.read_text())["services"]


@pytest.mark.skipif(shutil.which("docker") is None, reason="the docker CLI is not installed")
def test_docker_accepts_the_compose_file():
    result = subprocess.run(
        ["docker", "stack", "config", "-c", str(COMPOSE)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert "crescent.conductor" in result.stdout
    assert "deploy/prometheus/prometheus.yml" in result.stdout


def test_prometheus_scrapes_every_crescent_service_at_its_http_port():
    """Each service serves /metrics on CRESCENT_HTTP_PORT; a service Prometheus does not scrape
    is missing from the dashboard."""
    prometheus = services()["prometheus"]
    [mount] = [v for v in prometheus["volumes"] if v.endswith("/etc/prometheus/prometheus.yml:ro")]
    config = yaml.safe_load((ROOT / mount.split(":")[0]).read_text())
    scraped = {
        target
        for job in config["scrape_configs"]
        for static in job["static_configs"]
        for target in static["targets"]
    }
    expected = {
        f"{name}:{services()[name]['environment']['CRESCENT_HTTP_PORT']}" for name in CRESCENT
    }
    assert scraped == expected
    assert all(
        job.get("metrics_path", "/metrics") == "/metrics" for job in config["scrape_configs"]
    )


def test_topology_matches_the_design():
    assert set(services()) == EXPECTED
    jaeger = services()["jaeger"]
    assert jaeger["environment"]["COLLECTOR_OTLP_ENABLED"] == "true"
    assert any(port.endswith(":4318") for port in jaeger["ports"])


@pytest.mark.parametrize("name", sorted(CRESCENT))
def test_each_service_image_installs_the_package_it_runs(name):
    service = services()[name]
    module = service["command"][service["command"].index("-m") + 1]
    packages = service["build"]["args"]["PACKAGES"].split()
    assert (ROOT / service["build"]["dockerfile"]).exists()
    for package in packages:
        assert (ROOT / package / "pyproject.toml").exists(), package
    role = module.split(".")[1]
    assert f"services/{role}" in packages
    # Every crescent-* distribution the image needs is installed from the repository, as none is
    # on PyPI.
    assert missing_crescent_requirements(packages) == [], (
        f"{name} image lacks what its packages need"
    )
    assert service["environment"]["OTEL_EXPORTER_OTLP_ENDPOINT"] == "http://jaeger:4318"


def test_the_conductors_readiness_is_ready_and_its_liveness_health():
    """/ready needs a live prefill and decode instance; /health only a live conductor (the
    Kubernetes probes: tests/unit/test_k8s_manifests.py)."""
    assert "/ready" in " ".join(services()["conductor"]["healthcheck"]["test"])
    assert all(
        "/health" in " ".join(services()[name]["healthcheck"]["test"])
        for name in CRESCENT - {"conductor"}
    )


def test_etcd_compacts_its_history_as_every_other_etcd_crescent_runs():
    """Block metadata churns: with etcd's defaults its database grew until the quota would stop
    writes, and its memory with it."""
    from crescent.cluster.infra import COMPACTION_RETENTION, SNAPSHOT_COUNT, etcd_spec

    expected = {
        "auto-compaction-mode": "periodic",
        "auto-compaction-retention": COMPACTION_RETENTION,
        "snapshot-count": str(SNAPSHOT_COUNT),
    }
    flags = dict(arg[2:].split("=", 1) for arg in services()["etcd"]["command"][1:])
    argv = etcd_spec(2379, Path("/tmp/etcd")).argv
    local = {name: argv[argv.index(f"--{name}") + 1] for name in expected}
    outside = yaml.safe_load((ROOT / "deploy/etcd/etcd-member.yml").read_text())
    for name, value in expected.items():
        assert flags[name] == local[name] == str(outside[name]) == value, name
