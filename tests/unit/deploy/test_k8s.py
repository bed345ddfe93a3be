"""The Kubernetes manifests: every overlay renders, every object is valid against the Kubernetes schemas,
and the gateway's Deployment, ConfigMap and Services agree with the gateway's real options."""

from __future__ import annotations

import functools
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from tests.unit.deploy.deploy_checks import DEPLOY, gateway_command, gateway_env_names, load_gateway_config

K8S = DEPLOY / "k8s"
OVERLAYS = ["base", "overlays/nvidia", "overlays/amd"]
KUBERNETES_VERSION = "1.32.0"
GPU = {"overlays/nvidia": "nvidia.com/gpu", "overlays/amd": "amd.com/gpu"}


@functools.cache
def render(overlay: str) -> tuple[dict[str, Any], ...]:
    kubectl, kustomize = shutil.which("kubectl"), shutil.which("kustomize")
    if kubectl:
        command = [kubectl, "kustomize", str(K8S / overlay)]
    elif kustomize:
        command = [kustomize, "build", str(K8S / overlay)]
    else:
        raise AssertionError("neither kubectl nor kustomize is installed: cannot render the manifests")
    result = subprocess.run(command, capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    return tuple(doc for doc in yaml.safe_load_all(result.stdout) if doc)


def find(overlay: str, kind: str, name: str) -> dict[str, Any]:
    return next(d for d in render(overlay) if d["kind"] == kind and d["metadata"]["name"] == name)


def _container(workload: dict[str, Any], name: str) -> dict[str, Any]:
    return next(c for c in workload["spec"]["template"]["spec"]["containers"] if c["name"] == name)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_every_object_is_valid_against_the_kubernetes_schemas(overlay: str) -> None:
    kinds = set()
    for doc in render(overlay):
        kinds.add(doc["kind"])
        if doc["apiVersion"].startswith("monitoring.coreos.com/"):  # a CRD: not in Kubernetes' schemas
            assert doc["kind"] == "ServiceMonitor" and doc["spec"]["selector"] and doc["spec"]["endpoints"]
            continue
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    expected = {"Deployment", "StatefulSet", "Service", "ConfigMap", "Secret", "PodDisruptionBudget"}
    assert expected | {"HorizontalPodAutoscaler", "ServiceMonitor", "Namespace"} <= kinds


def test_the_schema_check_catches_a_mistake() -> None:
    deployment = find("base", "Deployment", "switchyard")
    broken = yaml.safe_load(yaml.safe_dump(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/ready"
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(broken, KUBERNETES_VERSION, strict=True)


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_gateway_deployment_matches_its_config(overlay: str, tmp_path: Path) -> None:
    config = find(overlay, "ConfigMap", "switchyard-config")["data"]
    settings = load_gateway_config(config["gateway.yaml"], tmp_path, policy=config["policy.yaml"])
    deployment = find(overlay, "Deployment", "switchyard")
    spec = deployment["spec"]["template"]["spec"]
    gateway = _container(deployment, "gateway")
    args = gateway_command(
        ["serve", *gateway["args"][1:]] if gateway["args"][0] == "serve" else gateway["args"]
    )
    mount = next(m for m in gateway["volumeMounts"] if m["name"] == "config")
    assert args.config == f"{mount['mountPath']}/gateway.yaml" and "subPath" not in mount
    assert args.host == "0.0.0.0"
    ports = {p["name"]: p["containerPort"] for p in gateway["ports"]}
    assert ports["http"] == settings.server.port
    assert ports["admin"] == getattr(settings.server, "admin_port", None) or ports["admin"] == 8081
    assert gateway["readinessProbe"]["httpGet"] == {"path": "/ready", "port": "http"}
    assert gateway["livenessProbe"]["httpGet"] == {"path": "/health", "port": "http"}
    pre_stop = gateway["lifecycle"]["preStop"]["sleep"]["seconds"]
    assert spec["terminationGracePeriodSeconds"] >= pre_stop + settings.server.shutdown_grace
    assert {e["name"] for e in gateway["env"]} <= gateway_env_names()
    assert next(e for e in gateway["env"] if e["name"] == "SWITCHYARD_ADMIN_KEY")["valueFrom"]["secretKeyRef"]
    assert deployment["spec"]["replicas"] == 3
    assert spec["affinity"]["podAntiAffinity"]
    assert spec["securityContext"]["runAsNonRoot"] is True
    assert settings.ledger.redis_url == "redis://switchyard-redis:6379/0"
    assert "auth:\n  mode: keys" in config["gateway.yaml"]
    backends = {b.url for b in settings.backends}
    assert backends == {"http://vllm-0.vllm:8000", "http://vllm-1.vllm:8000"}


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_admin_port_stays_off_the_public_service(overlay: str) -> None:
    public = find(overlay, "Service", "switchyard")
    assert [p["targetPort"] for p in public["spec"]["ports"]] == ["http"]
    internal = find(overlay, "Service", "switchyard-internal")
    monitor = find(overlay, "ServiceMonitor", "switchyard")
    labels = internal["metadata"]["labels"]
    assert all(labels.get(k) == v for k, v in monitor["spec"]["selector"]["matchLabels"].items())
    assert not all(
        public["metadata"]["labels"].get(k) == v
        for k, v in monitor["spec"]["selector"]["matchLabels"].items()
    )


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_scaling_and_disruption_keep_replicas_serving(overlay: str) -> None:
    pdb = find(overlay, "PodDisruptionBudget", "switchyard")
    hpa = find(overlay, "HorizontalPodAutoscaler", "switchyard")
    assert pdb["spec"]["minAvailable"] == 2
    assert hpa["spec"]["minReplicas"] == 3 and hpa["spec"]["scaleTargetRef"]["name"] == "switchyard"


@pytest.mark.parametrize("overlay", list(GPU))
def test_gpu_overlays_request_their_vendors_gpu(overlay: str) -> None:
    vllm = find(overlay, "StatefulSet", "vllm")
    spec = vllm["spec"]["template"]["spec"]
    container = _container(vllm, "vllm")
    resource = GPU[overlay]
    assert container["resources"]["limits"][resource] == "1"
    assert next(r for r in GPU.values() if r != resource) not in container["resources"]["limits"]
    assert spec["nodeSelector"] and any(t["key"] == resource for t in spec["tolerations"])
    assert container["startupProbe"]["httpGet"]["path"] == "/health"
    assert container["readinessProbe"]["httpGet"]["path"] == "/health"
    shm = next(v for v in spec["volumes"] if v["name"] == "shm")
    assert shm["emptyDir"]["medium"] == "Memory"
    assert any(m["mountPath"] == "/dev/shm" for m in container["volumeMounts"])
    image = container["image"]
    assert image.startswith("vllm/vllm-openai" if resource.startswith("nvidia") else "rocm/vllm")
    vendor = "nvidia" if resource.startswith("nvidia") else "amd"
    gateway_yaml = find(overlay, "ConfigMap", "switchyard-config")["data"]["gateway.yaml"]
    assert f"vendor: {vendor}" in gateway_yaml


def test_the_base_ships_the_balanced_preset_as_it_is() -> None:
    """The ConfigMap's policy is the preset's text, not a copy that drifts from it."""
    policy = find("base", "ConfigMap", "switchyard-config")["data"]["policy.yaml"]
    assert policy == (DEPLOY.parent / "policies" / "presets" / "balanced.yaml").read_text()


@pytest.mark.parametrize("overlay", OVERLAYS)
def test_the_ingress_reaches_the_public_service_and_the_gateway_trusts_its_forwarded_for(
    overlay: str, tmp_path: Path
) -> None:
    import ipaddress

    ingress = find(overlay, "Ingress", "switchyard")
    backends = [p["backend"]["service"] for r in ingress["spec"]["rules"] for p in r["http"]["paths"]]
    assert backends == [{"name": "switchyard", "port": {"name": "http"}}]
    config = find(overlay, "ConfigMap", "switchyard-config")["data"]
    server = load_gateway_config(config["gateway.yaml"], tmp_path, policy=config["policy.yaml"]).server
    assert server.forwarded_for is True and server.proxy_protocol == "off"
    assert server.trusted_proxies and all(ipaddress.ip_network(n).is_private for n in server.trusted_proxies)
