"""deploy/k8s/autoscaling scales what exists by what the conductor exports: the HPAs target the
Deployments of deploy/k8s/crescent.yaml on the conductor's desired-instances gauge, and the
bounds ConfigMap names real conductor settings."""

from dataclasses import fields
from pathlib import Path

import yaml

from crescent.conductor import metrics
from crescent.conductor.settings import ConductorSettings

ROOT = Path(__file__).resolve().parents[2]
HERE = ROOT / "deploy/k8s/autoscaling"


def documents(path: Path) -> list[dict]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d]


def test_each_role_has_an_hpa_on_the_desired_instances_gauge_of_its_deployment():
    deployments = {
        d["metadata"]["name"]
        for d in documents(ROOT / "deploy/k8s/crescent.yaml")
        if d["kind"] == "Deployment"
    }
    gauge = metrics.DESIRED_INSTANCES._name
    roles = {}
    for hpa in documents(HERE / "hpa.yaml"):
        assert hpa["apiVersion"] == "autoscaling/v2" and hpa["kind"] == "HorizontalPodAutoscaler"
        target = hpa["spec"]["scaleTargetRef"]["name"]
        assert target in deployments
        (metric,) = hpa["spec"]["metrics"]
        assert metric["external"]["metric"]["name"] == gauge
        assert metric["external"]["target"] == {"type": "AverageValue", "averageValue": "1"}
        roles[metric["external"]["metric"]["selector"]["matchLabels"]["role"]] = target
    assert roles == {"prefill": "crescent-prefill", "decode": "crescent-decode"}
    adapter = yaml.safe_load(documents(HERE / "prometheus-adapter.yaml")[0]["data"]["config.yaml"])
    assert adapter["externalRules"][0]["name"]["as"] == gauge


def test_the_bounds_configmap_sets_real_conductor_settings():
    names = {f"CRESCENT_{f.name.upper()}" for f in fields(ConductorSettings)}
    (config,) = documents(HERE / "conductor-bounds.yaml")
    assert set(config["data"]) <= names
    defaults = ConductorSettings()
    values = {key.removeprefix("CRESCENT_").lower(): value for key, value in config["data"].items()}
    settings = ConductorSettings(
        **{name: type(getattr(defaults, name))(value) for name, value in values.items()}
    )
    settings.ratio_config().validate()
    hpas = {h["spec"]["scaleTargetRef"]["name"]: h["spec"] for h in documents(HERE / "hpa.yaml")}
    assert (hpas["crescent-prefill"]["minReplicas"], hpas["crescent-prefill"]["maxReplicas"]) == (
        settings.autoscale_min_prefill,
        settings.autoscale_max_prefill,
    )
    assert (hpas["crescent-decode"]["minReplicas"], hpas["crescent-decode"]["maxReplicas"]) == (
        settings.autoscale_min_decode,
        settings.autoscale_max_decode,
    )
