"""Deployment artifacts, validated offline: Kubernetes manifests, the Helm chart, the Dockerfile.

Every Kubernetes object (the plain manifests under deploy/kubernetes and the chart rendered with several values
combinations) is validated against the Kubernetes OpenAPI schemas that `kubernetes-validate` ships, in strict mode
(unknown fields are errors), for the oldest supported and the newest known Kubernetes version. On top of the schemas,
the objects are checked for what the schemas cannot see: references that resolve (ConfigMaps, Secrets, Services,
selectors, named ports), the proxy's hardening and probes, a grace period longer than the proxy's drain, and an
environment plus config file that the proxy's own settings loader accepts.

The chart is rendered by Helm's Go SDK itself (the `helm-python-sdk` package: Helm's engine, no binary, no cluster),
so template behaviour is Helm's, not an imitation.
"""

from __future__ import annotations

import base64
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import kubernetes_validate
import pytest
import yaml

from proxy.config import ENV_PREFIX, FIELDS, env_name, load_settings

REPO = Path(__file__).resolve().parents[2]
DEPLOY = REPO / "deploy"
KUBE_DIR = DEPLOY / "kubernetes"
KUBE_FOLDERS = sorted(path for path in KUBE_DIR.iterdir() if path.is_dir())
CHART = DEPLOY / "helm" / "compaction-proxy"
DOCKERFILE = DEPLOY / "Dockerfile"

# Oldest supported version (native sidecar containers are on by default from 1.29) and the newest schemas known.
K8S_VERSIONS = ("1.29.0", kubernetes_validate.latest_version())
# Kinds with no schema in kubernetes-validate (CRDs): checked by hand below.
CRD_KINDS = {("monitoring.coreos.com/v1", "ServiceMonitor")}

PROXY_IMAGE = "compaction-proxy"
PROXY_ENV = {env_name(field) for field in FIELDS} | {ENV_PREFIX + "CONFIG"}
WORKLOAD_KINDS = {"Deployment", "StatefulSet", "DaemonSet"}

Doc = dict[str, Any]


# ----------------------------------------------------------------------------------------------------------------------
# Loading
# ----------------------------------------------------------------------------------------------------------------------


def load_docs(text: str) -> list[Doc]:
    """Parse a multi-document YAML stream, dropping empty documents."""
    return [doc for doc in yaml.safe_load_all(text) if doc]


def kustomization(folder: Path) -> Doc:
    return yaml.safe_load((folder / "kustomization.yaml").read_text())


def folder_docs(folder: Path) -> list[Doc]:
    """The objects of one kustomize folder, in the order its kustomization lists them."""
    docs: list[Doc] = []
    for resource in kustomization(folder)["resources"]:
        docs.extend(load_docs((folder / resource).read_text()))
    return docs


@pytest.fixture(scope="module")
def helm() -> ModuleType:
    """Helm's Go SDK (`helm-python-sdk`, a dev dependency): renders and lints the chart with no binary or cluster."""
    try:
        import helm_python
    except ImportError:
        message = "helm-python-sdk is not installed (it is in the dev extras: pip install -e '.[dev]')"
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    return helm_python


AGENT_IMAGE = "registry.example.com/agent:1.0.0"
SIDECAR_ONLY = {"gateway": {"enabled": False}, "sidecar": {"enabled": True, "agent": {"image": AGENT_IMAGE}}}


@dataclass(frozen=True)
class ChartCase:
    """One values combination and what it must render."""

    values: dict[str, Any]
    kinds: tuple[str, ...]
    external_secrets: tuple[str, ...] = ()


CHART_CASES: dict[str, ChartCase] = {
    "gateway-default": ChartCase(
        {},
        (
            "ConfigMap",
            "Deployment",
            "Deployment",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Secret",
            "Service",
            "Service",
        ),
    ),
    "gateway-external-redis": ChartCase(
        {"redis": {"enabled": False, "url": "redis://redis.cache.svc.cluster.local:6379/0"}},
        ("ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service"),
    ),
    "gateway-external-redis-secrets-monitor": ChartCase(
        {
            "redis": {"enabled": False, "existingUrlSecret": {"name": "redis-url", "key": "url"}},
            "tenantKey": {"existingSecret": "my-tenant-key", "existingSecretKey": "key"},
            "serviceMonitor": {"enabled": True},
            "gateway": {"replicaCount": 5, "podDisruptionBudget": {"enabled": False}},
            "mode": "observe",
        },
        ("ConfigMap", "Deployment", "Service", "ServiceMonitor"),
        external_secrets=("redis-url", "my-tenant-key"),
    ),
    "gateway-grafana-dashboard": ChartCase(
        {"grafanaDashboard": {"enabled": True}, "redis": {"enabled": False}},
        ("ConfigMap", "ConfigMap", "Deployment", "PodDisruptionBudget", "Secret", "Service"),
    ),
    "sidecar": ChartCase(SIDECAR_ONLY, ("ConfigMap", "Deployment", "Secret")),
    "sidecar-classic-container": ChartCase(
        {**SIDECAR_ONLY, "sidecar": {**SIDECAR_ONLY["sidecar"], "native": False}},
        ("ConfigMap", "Deployment", "Secret"),
    ),
    "gateway-and-sidecar": ChartCase(
        {"sidecar": SIDECAR_ONLY["sidecar"]},
        (
            "ConfigMap",
            "Deployment",
            "Deployment",
            "Deployment",
            "NetworkPolicy",
            "PodDisruptionBudget",
            "Secret",
            "Service",
            "Service",
        ),
    ),
}


def render(helm: ModuleType, values: dict[str, Any]) -> dict[str, str]:
    with helm.Chart.load(str(CHART)) as chart:
        rendered: dict[str, str] = chart.render(values, name="demo", namespace="agents")
    return rendered


def rendered_docs(helm: ModuleType, values: dict[str, Any]) -> list[Doc]:
    docs: list[Doc] = []
    for path, text in sorted(render(helm, values).items()):
        if path.endswith(".yaml"):
            docs.extend(load_docs(text))
    return docs


# ----------------------------------------------------------------------------------------------------------------------
# Checks shared by the plain manifests and the rendered chart
# ----------------------------------------------------------------------------------------------------------------------


def validate_schemas(docs: Iterable[Doc]) -> None:
    for doc in docs:
        if (doc["apiVersion"], doc["kind"]) in CRD_KINDS:
            continue
        for version in K8S_VERSIONS:
            try:
                kubernetes_validate.validate(doc, version, strict=True)
            except kubernetes_validate.ValidationError as exc:
                pytest.fail(f"{doc['kind']}/{doc['metadata']['name']} invalid for Kubernetes {version}: {exc.message}")


def pods(docs: Iterable[Doc]) -> Iterator[tuple[Doc, Doc]]:
    """(workload, pod template) for every workload."""
    for doc in docs:
        if doc["kind"] in WORKLOAD_KINDS:
            yield doc, doc["spec"]["template"]


def all_containers(pod_spec: Doc) -> list[Doc]:
    return [*pod_spec.get("initContainers", []), *pod_spec["containers"]]


def is_proxy(container: Doc) -> bool:
    image: str = container["image"]
    name = image.rsplit("/", 1)[-1]
    return re.split(r"[:@]", name, maxsplit=1)[0] == PROXY_IMAGE


def by_kind(docs: Iterable[Doc], kind: str) -> dict[str, Doc]:
    return {doc["metadata"]["name"]: doc for doc in docs if doc["kind"] == kind}


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(key) == value for key, value in selector.items())


def env_value(container: Doc, name: str) -> Any:
    for item in container.get("env", []):
        if item["name"] == name:
            return item.get("value", item.get("valueFrom"))
    return None


def secret_data(secret: Doc) -> dict[str, str]:
    data = {key: base64.b64decode(value).decode() for key, value in (secret.get("data") or {}).items()}
    data.update(secret.get("stringData") or {})
    return data


def check_references(docs: list[Doc], external_secrets: Iterable[str] = ()) -> None:
    """Everything one object names exists among the others, with the key or port it names."""
    config_maps = by_kind(docs, "ConfigMap")
    secrets = by_kind(docs, "Secret")
    services = by_kind(docs, "Service")
    workloads = list(pods(docs))
    assert workloads, "no workload"

    for workload, template in workloads:
        name = workload["metadata"]["name"]
        assert selects(workload["spec"]["selector"]["matchLabels"], template["metadata"]["labels"]), name
        spec = template["spec"]
        volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
        for volume in volumes.values():
            if "configMap" in volume:
                assert volume["configMap"]["name"] in config_maps, f"{name}: no ConfigMap {volume['configMap']}"
        for container in all_containers(spec):
            for mount in container.get("volumeMounts", []):
                assert mount["name"] in volumes, f"{name}/{container['name']}: no volume {mount['name']}"
            for item in container.get("env", []):
                ref = item.get("valueFrom", {}).get("secretKeyRef")
                if ref is None or ref["name"] in external_secrets:
                    continue
                assert ref["name"] in secrets, f"{name}/{container['name']}: no Secret {ref['name']}"
                assert ref["key"] in secret_data(secrets[ref["name"]]), f"{name}: Secret {ref['name']} has no {ref}"

    def pods_selected(selector: dict[str, str]) -> list[Doc]:
        return [template for _, template in workloads if selects(selector, template["metadata"]["labels"])]

    for service in services.values():
        selected = pods_selected(service["spec"]["selector"])
        assert selected, f"Service {service['metadata']['name']} selects no pod"
        for port in service["spec"]["ports"]:
            for template in selected:
                names = {
                    p.get("name")
                    for c in all_containers(template["spec"])
                    for p in c.get("ports", [])
                    if p["protocol"] == "TCP"
                }
                assert port["targetPort"] in names, f"Service {service['metadata']['name']}: no port {port}"
    for kind in ("PodDisruptionBudget", "NetworkPolicy", "ServiceMonitor"):
        for doc in by_kind(docs, kind).values():
            selector = doc["spec"]["podSelector" if kind == "NetworkPolicy" else "selector"]["matchLabels"]
            if kind == "ServiceMonitor":
                assert any(selects(selector, s["metadata"]["labels"]) for s in services.values()), doc
            else:
                assert pods_selected(selector), f"{kind} {doc['metadata']['name']} selects no pod"
    for policy in by_kind(docs, "NetworkPolicy").values():
        for rule in policy["spec"]["ingress"]:
            for peer in rule["from"]:
                assert pods_selected(peer["podSelector"]["matchLabels"]), f"NetworkPolicy admits no pod: {peer}"

    # A Redis state URL points at a Service of these manifests (or is external to them).
    for _, template in workloads:
        for container in filter(is_proxy, all_containers(template["spec"])):
            url = env_value(container, ENV_PREFIX + "STATE_URL")
            match = re.fullmatch(r"redis://([a-z0-9-]+):(\d+)/\d+", url) if isinstance(url, str) else None
            if match and "." not in match.group(1):
                service = services.get(match.group(1))
                assert service, f"state URL {url} names no Service"
                assert int(match.group(2)) in {p["port"] for p in service["spec"]["ports"]}, url


def check_hardening(docs: list[Doc]) -> list[Doc]:
    """The proxy containers are locked down, probed, resourced and drained in time; returns them."""
    proxies: list[Doc] = []
    for workload, template in pods(docs):
        name = workload["metadata"]["name"]
        spec = template["spec"]
        pod_security = spec.get("securityContext", {})
        assert spec.get("automountServiceAccountToken") is False, f"{name}: mounts a service account token"
        volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
        for container in all_containers(spec):
            where = f"{name}/{container['name']}"
            security = container.get("securityContext", {})
            assert security.get("allowPrivilegeEscalation") is False, where
            assert "ALL" in security.get("capabilities", {}).get("drop", []), where
            for bound in ("requests", "limits"):
                assert {"cpu", "memory"} <= set(container.get("resources", {}).get(bound, {})), f"{where}: {bound}"
        init_names = {c["name"] for c in spec.get("initContainers", [])}
        for container in filter(is_proxy, all_containers(spec)):
            where = f"{name}/{container['name']}"
            proxies.append(container)
            security = container["securityContext"]
            assert security["readOnlyRootFilesystem"] is True, where
            assert security.get("runAsNonRoot", pod_security.get("runAsNonRoot")) is True, where
            assert security.get("runAsUser", pod_security.get("runAsUser", 10001)) != 0, where
            ports = {p["name"]: p["containerPort"] for p in container["ports"]}
            assert ports == {"http": 8080}, where
            assert env_value(container, ENV_PREFIX + "PORT") in (None, "8080"), where
            assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}, where
            assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}, where
            tmp = [m for m in container["volumeMounts"] if m["mountPath"] == "/tmp"]
            assert tmp, f"{where}: /tmp is not mounted (the root filesystem is read-only)"
            assert "emptyDir" in volumes[tmp[0]["name"]], where
            unknown = {item["name"] for item in container["env"] if item["name"].startswith(ENV_PREFIX)} - PROXY_ENV
            assert not unknown, f"{where}: environment the proxy does not read: {unknown}"
            if container["name"] in init_names:
                # A native sidecar: it must keep running, and gate the agent's start on being ready.
                assert container.get("restartPolicy") == "Always", where
                assert container["startupProbe"]["httpGet"]["path"] == "/readyz", where
            grace = float(env_value(container, ENV_PREFIX + "SHUTDOWN_GRACE_SECONDS") or 30)
            pre_stop = container.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
            if pre_stop:
                assert pre_stop[0] == "sleep", where
                grace += float(pre_stop[1])
            assert spec["terminationGracePeriodSeconds"] > grace, f"{where}: the pod is killed before the drain ends"
        # An agent next to a proxy reaches it on localhost.
        if any(is_proxy(c) for c in all_containers(spec)):
            for agent in (c for c in spec["containers"] if not is_proxy(c)):
                assert env_value(agent, "OPENAI_BASE_URL") == "http://localhost:8080/v1", f"{name}/{agent['name']}"
    assert proxies, "no proxy container"
    return proxies


def check_proxy_settings(docs: list[Doc], tmp_path: Path, external_secrets: Iterable[str] = ()) -> list[Any]:
    """Each proxy container's environment and mounted config file load with the proxy's own settings loader."""
    config_maps = by_kind(docs, "ConfigMap")
    secrets = by_kind(docs, "Secret")
    loaded = []
    for index, (_, template) in enumerate(pods(docs)):
        spec = template["spec"]
        volumes = {volume["name"]: volume for volume in spec.get("volumes", [])}
        for container in filter(is_proxy, all_containers(spec)):
            environ: dict[str, str] = {}
            for item in container["env"]:
                if "value" in item:
                    environ[item["name"]] = item["value"]
                    continue
                ref = item["valueFrom"]["secretKeyRef"]
                if ref["name"] in external_secrets:
                    environ[item["name"]] = "redis://external:6379/0" if "STATE_URL" in item["name"] else "k" * 32
                else:
                    value = secret_data(secrets[ref["name"]])[ref["key"]]
                    # The example's placeholder, replaced as its instructions say (the proxy refuses it as it is).
                    environ[item["name"]] = "k" * 32 if value.startswith("REPLACE-ME") else value
            config_path = environ.get(ENV_PREFIX + "CONFIG")
            if config_path:
                mount = next(m for m in container["volumeMounts"] if config_path.startswith(m["mountPath"] + "/"))
                config_map = config_maps[volumes[mount["name"]]["configMap"]["name"]]
                file_name = config_path.removeprefix(mount["mountPath"] + "/")
                local = tmp_path / f"{index}-{container['name']}" / file_name
                local.parent.mkdir(parents=True, exist_ok=True)
                local.write_text(config_map["data"][file_name])
                environ[ENV_PREFIX + "CONFIG"] = str(local)
            loaded.append(load_settings(cli={}, environ=environ))
    return loaded


# ----------------------------------------------------------------------------------------------------------------------
# Plain manifests (deploy/kubernetes)
# ----------------------------------------------------------------------------------------------------------------------


def test_the_two_examples_exist() -> None:
    assert [folder.name for folder in KUBE_FOLDERS] == ["gateway", "sidecar"]


@pytest.mark.parametrize("folder", KUBE_FOLDERS, ids=lambda folder: folder.name)
def test_kustomization_lists_every_manifest(folder: Path) -> None:
    listed = kustomization(folder)["resources"]
    present = sorted(path.name for path in folder.glob("*.yaml") if path.name != "kustomization.yaml")
    assert sorted(listed) == present
    image_names = {image["name"] for image in kustomization(folder).get("images", [])}
    assert image_names == {PROXY_IMAGE}


@pytest.mark.parametrize("folder", KUBE_FOLDERS, ids=lambda folder: folder.name)
def test_manifests_match_the_kubernetes_schemas(folder: Path) -> None:
    validate_schemas(folder_docs(folder))


@pytest.mark.parametrize("folder", KUBE_FOLDERS, ids=lambda folder: folder.name)
def test_manifests_reference_what_exists_and_are_hardened(folder: Path, tmp_path: Path) -> None:
    docs = folder_docs(folder)
    check_references(docs)
    check_hardening(docs)
    for settings in check_proxy_settings(docs, tmp_path):
        assert settings.upstream == "https://api.openai.com"
        assert settings.port == 8080
        if folder.name == "gateway":
            assert settings.state_url.startswith("redis://")
            assert 0 < settings.compact_to < settings.compact_at <= 1
        else:
            assert settings.state_url == "memory://"


def test_gateway_shape() -> None:
    docs = folder_docs(KUBE_DIR / "gateway")
    gateway = by_kind(docs, "Deployment")["compaction-proxy"]
    assert gateway["spec"]["replicas"] == 3
    service = by_kind(docs, "Service")["compaction-proxy"]
    assert service["spec"]["type"] == "ClusterIP"
    assert [(p["port"], p["targetPort"]) for p in service["spec"]["ports"]] == [(80, "http")]
    assert by_kind(docs, "PodDisruptionBudget")["compaction-proxy"]["spec"]["maxUnavailable"] == 1
    tenant = env_value(gateway["spec"]["template"]["spec"]["containers"][0], ENV_PREFIX + "TENANT_KEY")
    assert tenant == {"secretKeyRef": {"name": "compaction-proxy-tenant-key", "key": "tenant-key"}}


@pytest.mark.parametrize("folder", KUBE_FOLDERS, ids=lambda folder: folder.name)
def test_kustomize_builds_the_folder(folder: Path) -> None:
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl (for `kubectl kustomize`) is not on PATH; the kustomization is still checked above")
    built = subprocess.run([kubectl, "kustomize", str(folder)], capture_output=True, text=True, timeout=60, check=False)
    assert built.returncode == 0, built.stderr
    docs = load_docs(built.stdout)
    key = lambda doc: (doc["kind"], doc["metadata"]["name"])  # noqa: E731
    assert sorted(map(key, docs)) == sorted(map(key, folder_docs(folder)))
    validate_schemas(docs)


# ----------------------------------------------------------------------------------------------------------------------
# Helm chart
# ----------------------------------------------------------------------------------------------------------------------


def test_chart_lints_clean(helm: ModuleType) -> None:
    for values in [{}, *(case.values for case in CHART_CASES.values())]:
        report = helm.lint(str(CHART), values, strict=True, kube_version="v1.29.0")
        problems = [m for m in report["messages"] if m["severity"] >= 2 and m["error"] != "icon is recommended"]
        assert not report["errors"] and not problems, (values, report)


@pytest.mark.parametrize("case", CHART_CASES, ids=str)
def test_chart_renders_valid_objects(helm: ModuleType, case: str, tmp_path: Path) -> None:
    spec = CHART_CASES[case]
    docs = rendered_docs(helm, spec.values)
    assert sorted(doc["kind"] for doc in docs) == sorted(spec.kinds)
    validate_schemas(docs)
    check_references(docs, spec.external_secrets)
    check_hardening(docs)
    settings = check_proxy_settings(docs, tmp_path, spec.external_secrets)
    assert settings
    for monitor in by_kind(docs, "ServiceMonitor").values():
        [endpoint] = monitor["spec"]["endpoints"]
        assert (endpoint["port"], endpoint["path"]) == ("http", "/metrics")


def test_chart_gateway_defaults(helm: ModuleType, tmp_path: Path) -> None:
    docs = rendered_docs(helm, {})
    gateway = by_kind(docs, "Deployment")["demo-compaction-proxy"]
    assert gateway["spec"]["replicas"] == 3
    service = by_kind(docs, "Service")["demo-compaction-proxy"]
    assert (service["spec"]["type"], service["spec"]["ports"][0]["port"]) == ("ClusterIP", 80)
    [settings] = check_proxy_settings(docs, tmp_path)
    assert settings.state_url == "redis://demo-compaction-proxy-redis:6379/0"
    assert settings.mode.value == "enforce"
    # The generated tenant key is random, long, and differs per render when nothing exists in the cluster yet.
    key = settings.tenant_key.get_secret_value()
    assert len(key) == 48
    [again] = check_proxy_settings(rendered_docs(helm, {}), tmp_path / "again")
    assert again.tenant_key.get_secret_value() != key


GRAFANA_BOARD = DEPLOY / "grafana" / "compaction-proxy.json"


def test_chart_grafana_dashboard_is_off_by_default_and_labelled_for_the_sidecar(helm: ModuleType) -> None:
    assert not [doc for doc in rendered_docs(helm, {}) if doc["metadata"]["name"].endswith("grafana-dashboard")]
    annotations = {"k8s-sidecar-target-directory": "llm"}
    values = {"grafanaDashboard": {"enabled": True, "namespace": "monitoring", "annotations": annotations}}
    [board] = [doc for doc in rendered_docs(helm, values) if doc["metadata"]["name"].endswith("grafana-dashboard")]
    assert board["kind"] == "ConfigMap" and board["metadata"]["namespace"] == "monitoring"
    assert board["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert board["metadata"]["annotations"] == annotations
    # The chart ships the same board as deploy/grafana, byte for byte, and it is one JSON document.
    assert board["data"]["compaction-proxy.json"] == GRAFANA_BOARD.read_text().rstrip("\n")
    assert json.loads(board["data"]["compaction-proxy.json"])["uid"] == "compaction-proxy"
    relabelled = {"grafanaDashboard": {"enabled": True, "sidecarLabel": "dashboards", "sidecarLabelValue": "llm"}}
    [board] = [doc for doc in rendered_docs(helm, relabelled) if doc["metadata"]["name"].endswith("grafana-dashboard")]
    assert board["metadata"]["labels"]["dashboards"] == "llm" and "grafana_dashboard" not in board["metadata"]["labels"]


def test_chart_external_redis_and_secrets(helm: ModuleType) -> None:
    docs = rendered_docs(helm, CHART_CASES["gateway-external-redis-secrets-monitor"].values)
    [gateway] = by_kind(docs, "Deployment").values()
    [container] = gateway["spec"]["template"]["spec"]["containers"]
    assert env_value(container, ENV_PREFIX + "STATE_URL") == {"secretKeyRef": {"name": "redis-url", "key": "url"}}
    assert env_value(container, ENV_PREFIX + "TENANT_KEY") == {"secretKeyRef": {"name": "my-tenant-key", "key": "key"}}
    assert not by_kind(docs, "Secret"), "an existing Secret must not be generated too"

    plain = rendered_docs(helm, CHART_CASES["gateway-external-redis"].values)
    [gateway] = by_kind(plain, "Deployment").values()
    [container] = gateway["spec"]["template"]["spec"]["containers"]
    assert env_value(container, ENV_PREFIX + "STATE_URL") == "redis://redis.cache.svc.cluster.local:6379/0"


@pytest.mark.parametrize("native", [True, False])
def test_chart_sidecar_example(helm: ModuleType, native: bool) -> None:
    values = {**SIDECAR_ONLY, "sidecar": {**SIDECAR_ONLY["sidecar"], "native": native}}
    [agent] = by_kind(rendered_docs(helm, values), "Deployment").values()
    spec = agent["spec"]["template"]["spec"]
    proxies = [c for c in all_containers(spec) if is_proxy(c)]
    assert len(proxies) == 1
    assert (proxies[0] in spec.get("initContainers", [])) is native
    assert env_value(proxies[0], ENV_PREFIX + "STATE_URL") == "memory://"
    [app] = [c for c in spec["containers"] if not is_proxy(c)]
    assert app["image"] == AGENT_IMAGE


def test_chart_config_values_reach_the_config_file(helm: ModuleType, tmp_path: Path) -> None:
    config = {"compact_at": 0.9, "compact_to": 0.5, "strategies": ["sliding_window"], "context_windows": {"m": 4096}}
    config["prices"] = {"llama-*": {"input": 0.2, "output": 0.6}}
    docs = rendered_docs(helm, {"config": config, "mode": "observe", "upstream": "https://api.groq.com/openai"})
    [settings] = check_proxy_settings(docs, tmp_path)
    assert (settings.compact_at, settings.compact_to, settings.strategies) == (0.9, 0.5, ["sliding_window"])
    assert settings.context_windows == {"m": 4096}
    assert settings.prices["llama-*"].model_dump() == {"input": 0.2, "output": 0.6, "cached": None, "cache_write": None}
    assert (settings.mode.value, settings.upstream) == ("observe", "https://api.groq.com/openai")


def test_chart_routes_reach_the_settings(helm: ModuleType, tmp_path: Path) -> None:
    local = {"name": "local", "upstream": "http://vllm.models:8000", "models": ["llama-*"]}
    values = {"anthropicUpstream": "https://anthropic.internal", "config": {"routes": [local]}}
    [settings] = check_proxy_settings(rendered_docs(helm, values), tmp_path)
    table = [(route.name, route.upstream) for route in settings.route_table()]
    assert table == [
        ("local", "http://vllm.models:8000"),
        ("anthropic", "https://anthropic.internal"),
        ("default", "https://api.openai.com"),
    ]


def test_chart_otel_endpoint_reaches_the_settings(helm: ModuleType, tmp_path: Path) -> None:
    [settings] = check_proxy_settings(rendered_docs(helm, {"otelEndpoint": "http://otel.observability:4318"}), tmp_path)
    assert settings.otel_endpoint == "http://otel.observability:4318"
    [default] = check_proxy_settings(rendered_docs(helm, {}), tmp_path)
    assert default.otel_endpoint is None
    with pytest.raises(helm.HelmError, match="otelEndpoint"):
        render(helm, {"otelEndpoint": "otel:4318"})


@pytest.mark.parametrize(
    ("values", "workers"),
    [
        ({}, "2"),
        ({"gateway": {"resources": {"limits": {"cpu": "4"}}}}, "4"),
        ({"gateway": {"resources": {"limits": {"cpu": 3}}}}, "3"),
        ({"gateway": {"resources": {"limits": {"cpu": "2.5"}}}}, "2"),
        ({"gateway": {"resources": {"limits": {"cpu": "1500m"}}}}, "1"),
        ({"gateway": {"resources": {"limits": {"cpu": "500m"}}}}, "1"),
        ({"gateway": {"workers": 3}}, "3"),
        ({"redis": {"enabled": False}}, "1"),
        ({"redis": {"enabled": False, "url": "redis://r:6379/0"}, "gateway": {"workers": 5}}, "5"),
    ],
    ids=["default-2-cpus", "4-cpus", "3-cpus-number", "2.5-cpus", "1500m", "500m", "explicit", "memory-state", "url"],
)
def test_chart_sets_workers_from_the_cpu_limit(helm: ModuleType, values: dict[str, Any], workers: str) -> None:
    gateway = by_kind(rendered_docs(helm, values), "Deployment")["demo-compaction-proxy"]
    [container] = gateway["spec"]["template"]["spec"]["containers"]
    assert env_value(container, ENV_PREFIX + "WORKERS") == workers


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"gateway": {"enabled": False}}, "enable gateway.enabled, sidecar.enabled, or both"),
        ({"sidecar": {"enabled": True}}, "sidecar.enabled needs sidecar.agent.image"),
        ({"redis": {"url": "redis://r:6379/0"}}, "not both"),
        ({"redis": {"enabled": False, "url": "redis://r:6379/0", "existingUrlSecret": {"name": "s"}}}, "not both"),
        ({"replicaCont": 2}, "replicaCont"),
        ({"mode": "on"}, "enforce"),
        ({"config": {"compact_at": 1.5}}, "compact_at"),
        ({"redis": {"enabled": False}, "gateway": {"workers": 2}}, "gateway.workers > 1 needs shared state"),
        ({"grafanaDashboard": {"enabled": "yes"}}, "/grafanaDashboard/enabled"),
        ({"grafanaDashboard": {"folder": "llm"}}, "folder"),
    ],
    ids=[
        "nothing-enabled",
        "sidecar-without-agent",
        "two-redis",
        "url-and-secret",
        "typo",
        "bad-mode",
        "bad-config",
        "workers-without-redis",
        "grafana-enabled-not-a-boolean",
        "grafana-unknown-key",
    ],
)
def test_chart_rejects_bad_values(helm: ModuleType, values: dict[str, Any], message: str) -> None:
    with pytest.raises(helm.HelmError, match=re.escape(message)):
        render(helm, values)


def test_chart_warns_about_replicas_without_shared_state(helm: ModuleType) -> None:
    notes = render(helm, {"redis": {"enabled": False}})["compaction-proxy/templates/NOTES.txt"]
    assert "WARNING: 3 replicas without Redis" in notes
    assert "WARNING" not in render(helm, {})["compaction-proxy/templates/NOTES.txt"]


def test_chart_schema_covers_every_default_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())

    def walk(node: Any, props: dict[str, Any], path: str) -> None:
        for key, value in node.items():
            assert key in props, f"{path}{key} is not in values.schema.json"
            sub = props[key].get("properties")
            if isinstance(value, dict) and sub is not None and props[key].get("additionalProperties") is False:
                walk(value, sub, f"{path}{key}.")

    walk(values, schema["properties"], "")


# ----------------------------------------------------------------------------------------------------------------------
# Dockerfile
# ----------------------------------------------------------------------------------------------------------------------


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, with continuation lines joined and comment lines dropped."""
    instructions: list[tuple[str, str]] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        keyword, _, rest = (pending + line).partition(" ")
        instructions.append((keyword.upper(), rest.strip()))
        pending = ""
    assert not pending, "dangling line continuation"
    return instructions


def stages() -> list[list[tuple[str, str]]]:
    result: list[list[tuple[str, str]]] = []
    for keyword, rest in dockerfile_instructions():
        if keyword == "FROM":
            result.append([])
        if result:
            result[-1].append((keyword, rest))
    return result


def test_dockerfile_is_multi_stage_from_python_slim() -> None:
    arguments = dict(
        rest.split("=", 1) for keyword, rest in dockerfile_instructions() if keyword == "ARG" and "=" in rest
    )
    froms = [rest for keyword, rest in dockerfile_instructions() if keyword == "FROM"]
    assert len(froms) >= 2
    assert froms[0].endswith(" AS builder")
    base = froms[-1].split()[0]
    base = re.sub(r"\$\{(\w+)\}", lambda m: arguments[m.group(1)], base)
    assert base == "python:3.11-slim"
    builder, runtime = stages()[0], stages()[-1]
    assert any(k == "RUN" and "pip wheel" in rest for k, rest in builder)
    assert any(k == "COPY" and rest.startswith("--from=builder ") for k, rest in runtime)


def test_dockerfile_runtime_stage() -> None:
    runtime = stages()[-1]
    last = {keyword: rest for keyword, rest in runtime}
    user = last["USER"].split(":")[0]
    assert user.isdigit() and int(user) != 0, "run as a numeric non-root user (lets Kubernetes check runAsNonRoot)"
    assert last["EXPOSE"] == "8080"
    assert json.loads(last["ENTRYPOINT"]) == ["compaction-proxy", "serve"]
    assert last["STOPSIGNAL"] == "SIGTERM"
    healthcheck = last["HEALTHCHECK"]
    command = json.loads(healthcheck.split(" CMD ", 1)[1])
    assert command[0] == "python" and "/healthz" in command[2]
    assert not re.search(r"\b(curl|wget)\b", healthcheck)
    # The health check's one-liner is valid Python.
    compile(command[2], "<healthcheck>", "exec")
    # The entry point is the package's console script.
    scripts = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["scripts"]
    assert "compaction-proxy" in scripts


def dockerignore_allows(path: str) -> bool:
    """Whether the root .dockerignore lets `path` into the build context (last matching pattern wins)."""
    allowed = True
    for raw in (REPO / ".dockerignore").read_text().splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        negated = line.startswith("!")
        pattern = line.lstrip("!").strip("/")
        regex = re.escape(pattern).replace(r"\*\*/", "(.*/)?").replace(r"\*", "[^/]*")
        if re.fullmatch(regex + "(/.*)?", path):
            allowed = negated
    return allowed


def test_dockerfile_copies_what_the_wheel_needs() -> None:
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    needed = {"pyproject.toml", pyproject["project"]["readme"]}
    needed |= {pattern.rstrip("*") for pattern in pyproject["tool"]["setuptools"]["packages"]["find"]["include"]}
    copied: set[str] = set()
    for keyword, rest in stages()[0]:
        if keyword == "COPY" and not rest.startswith("--from"):
            *sources, _ = rest.split()
            copied.update(sources)
    assert needed <= copied
    for source in copied:
        assert (REPO / source).exists(), source
        assert dockerignore_allows(source), f".dockerignore excludes {source}"
    assert not dockerignore_allows("tests/test_encodings.py")
    assert not dockerignore_allows("proxy/__pycache__/x.pyc")
    assert dockerignore_allows("proxy/engine/encodings/o200k_base.tiktoken")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def test_the_image_health_check_against_the_real_server(tmp_path: Path) -> None:
    """Run the proxy as the sidecar manifest configures it; the Dockerfile's HEALTHCHECK passes; SIGTERM stops it."""
    [(_, template)] = pods(folder_docs(KUBE_DIR / "sidecar"))
    [proxy] = [c for c in all_containers(template["spec"]) if is_proxy(c)]
    port = free_port()
    environ = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    environ.update({item["name"]: item["value"] for item in proxy["env"]})
    environ.update({ENV_PREFIX + "HOST": "127.0.0.1", ENV_PREFIX + "PORT": str(port)})
    environ.update({"PYTHONDONTWRITEBYTECODE": "1"})
    instructions = dict(stages()[-1])
    health_check = json.loads(instructions["HEALTHCHECK"].split(" CMD ", 1)[1])
    entrypoint = json.loads(instructions["ENTRYPOINT"])
    assert entrypoint[0] == "compaction-proxy"
    command = [sys.executable, "-m", "proxy.cli", *entrypoint[1:]]
    log = tmp_path / "proxy.log"
    with log.open("wb") as sink:
        server = subprocess.Popen(command, env=environ, cwd=tmp_path, stdout=sink, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while True:
            assert server.poll() is None, log.read_text()
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1) as response:
                    assert response.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline, "the proxy did not become ready"
                time.sleep(0.1)
        checked = subprocess.run(
            [sys.executable, *health_check[1:]], env=environ, capture_output=True, timeout=10, check=False
        )
        assert checked.returncode == 0, checked.stderr.decode()
        server.send_signal(signal.SIGTERM)
        assert server.wait(timeout=15) == 0, log.read_text()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
    # A failing health check exits non-zero (the server is gone now).
    failed = subprocess.run(
        [sys.executable, *health_check[1:]], env=environ, capture_output=True, timeout=10, check=False
    )
    assert failed.returncode != 0
