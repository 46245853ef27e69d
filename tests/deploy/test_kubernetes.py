"""deploy/kubernetes: every object deserializes into the `kubernetes` client's models with no unknown field and
its required fields, the pieces reference each other consistently (labels, ports, names, keys, paths), and the
ConfigMap's settings file is one the node accepts."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests.deploy import ADMIN_PORT, DEPLOY, KUBERNETES, load_yaml_docs, serve_argv_problems
from tidewire.gateway.config import Settings

KUBECTL = shutil.which("kubectl")
MODELS = {
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Secret"): "V1Secret",
    ("v1", "Service"): "V1Service",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "StatefulSet"): "V1StatefulSet",
    ("policy/v1", "PodDisruptionBudget"): "V1PodDisruptionBudget",
    ("autoscaling/v2", "HorizontalPodAutoscaler"): "V2HorizontalPodAutoscaler",
    ("networking.k8s.io/v1", "NetworkPolicy"): "V1NetworkPolicy",
}
OPTIONAL = {"service-mqtt-loadbalancer.yaml"}  # shipped, not applied unless added to kustomization.yaml
PRIMITIVES: dict[str, tuple[type, ...]] = {"str": (str,), "int": (int,), "bool": (bool,), "float": (int, float),
                                          "datetime": (str,), "date": (str,), "bytes": (str,)}
_LIST = re.compile(r"(?:List|list)\[(.+)\]")
_DICT = re.compile(r"Dict\[str, (.+)\]|dict\(str, (.+)\)")


def strict_problems(data: Any, type_name: str, where: str) -> list[str]:
    """Unknown fields and wrong primitive types, walking the client's own type map (`openapi_types` and
    `attribute_map`, present in every client version): the client's deserializer silently drops unknown keys."""
    type_name = type_name.strip()
    if m := _LIST.fullmatch(type_name):
        if not isinstance(data, list):
            return [f"{where}: expected a list"]
        return [p for i, item in enumerate(data) for p in strict_problems(item, m.group(1), f"{where}[{i}]")]
    if m := _DICT.fullmatch(type_name):
        if not isinstance(data, dict):
            return [f"{where}: expected a mapping"]
        inner = m.group(1) or m.group(2)
        return [p for k, v in data.items() for p in strict_problems(v, inner, f"{where}.{k}")]
    if type_name == "object":
        return []
    if type_name in PRIMITIVES:
        ok = isinstance(data, PRIMITIVES[type_name]) and (type_name == "bool" or not isinstance(data, bool))
        return [] if ok else [f"{where}: {data!r} is not a {type_name}"]
    model = getattr(client, type_name)
    if not isinstance(data, dict):
        return [f"{where}: expected a {type_name} mapping"]
    by_wire_name = {wire: attr for attr, wire in model.attribute_map.items()}
    problems = []
    for key, value in data.items():
        if key not in by_wire_name:
            problems.append(f"{where}.{key}: unknown field of {type_name}")
        elif value is not None:
            problems += strict_problems(value, model.openapi_types[by_wire_name[key]], f"{where}.{key}")
    return problems


def manifests() -> list[Path]:
    return sorted(p for p in KUBERNETES.glob("*.yaml") if p.name != "kustomization.yaml")


def objects() -> list[dict[str, Any]]:
    return [doc for path in manifests() for doc in load_yaml_docs(path)]


def the(kind: str, name: str | None = None) -> dict[str, Any]:
    (obj,) = [o for o in objects() if o["kind"] == kind and (name is None or o["metadata"]["name"] == name)]
    return obj


def container(workload: dict[str, Any]) -> dict[str, Any]:
    (c,) = workload["spec"]["template"]["spec"]["containers"]
    return c


def config_file_text() -> str:
    return str(the("ConfigMap", "tidewire-config")["data"]["tidewire.yaml"])


def config_values() -> dict[str, Any]:
    values: dict[str, Any] = yaml.safe_load(config_file_text())["tidewire"]
    return values


def port_number(c: dict[str, Any], port: int | str) -> int:
    """A probe's or Service's port: a number, or the name of one of the container's ports."""
    if isinstance(port, int):
        return port
    (match,) = [p["containerPort"] for p in c["ports"] if p["name"] == port]
    return int(match)


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return all(labels.get(k) == v for k, v in selector.items())


# -- every file, every object ---------------------------------------------------------------------------------

def test_every_yaml_file_under_deploy_parses() -> None:
    files = sorted([*DEPLOY.rglob("*.yaml"), *DEPLOY.rglob("*.yml")])
    assert len(files) >= 15
    for path in files:
        assert load_yaml_docs(path), f"{path} is empty"


@pytest.mark.parametrize("path", manifests(), ids=lambda p: p.name)
def test_objects_deserialize_strictly(path: Path) -> None:
    api = client.ApiClient()
    for obj in load_yaml_docs(path):
        model = MODELS.get((obj.get("apiVersion"), obj.get("kind")))
        assert model is not None, f"{path.name}: unexpected {obj.get('apiVersion')} {obj.get('kind')}"
        assert not strict_problems(obj, model, obj["kind"]), strict_problems(obj, model, obj["kind"])
        # the client's own deserializer: raises on a missing required field or a wrongly typed value
        parsed = api.deserialize(json.dumps(obj), model, "application/json")
        assert type(parsed).__name__ == model
        assert parsed.metadata.name == obj["metadata"]["name"]
        assert "namespace" not in obj["metadata"], "namespace-agnostic: `kubectl apply -k ... -n NS` chooses"
        assert obj["metadata"]["labels"]["app.kubernetes.io/name"] == "tidewire"


def test_strict_check_catches_unknown_and_mistyped_fields() -> None:
    deployment = the("Deployment", "tidewire")
    broken = json.loads(json.dumps(deployment))
    broken["spec"]["template"]["spec"]["containers"][0]["readinessProbe"]["httpGet"]["paht"] = "/readyz"
    broken["spec"]["replicas"] = "3"
    problems = strict_problems(broken, "V1Deployment", "Deployment")
    assert any("paht: unknown field" in p for p in problems)
    assert any("replicas" in p for p in problems)
    missing = json.loads(json.dumps(deployment))
    del missing["spec"]["selector"]
    with pytest.raises(Exception):  # noqa: B017 - the client raises ValueError or pydantic's error by version
        client.ApiClient().deserialize(json.dumps(missing), "V1Deployment", "application/json")


def test_kustomization_lists_every_manifest() -> None:
    (kustomization,) = load_yaml_docs(KUBERNETES / "kustomization.yaml")
    assert kustomization["kind"] == "Kustomization" and "namespace" not in kustomization
    resources = kustomization["resources"]
    assert len(resources) == len(set(resources))
    assert {p.name for p in manifests()} == set(resources) | OPTIONAL
    kinds = {o["kind"] for name in resources for o in load_yaml_docs(KUBERNETES / name)}
    assert kinds >= {"Deployment", "Service", "StatefulSet", "PodDisruptionBudget", "HorizontalPodAutoscaler",
                     "ConfigMap", "Secret"}


@pytest.mark.skipif(KUBECTL is None, reason="kubectl is not installed")
def test_kustomize_renders_every_object() -> None:
    out = subprocess.run([str(KUBECTL), "kustomize", str(KUBERNETES)], capture_output=True, text=True, timeout=60,
                         env={**os.environ, "KUBECONFIG": os.devnull})
    assert out.returncode == 0, out.stderr
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    (kustomization,) = load_yaml_docs(KUBERNETES / "kustomization.yaml")
    expected = [o for name in kustomization["resources"] for o in load_yaml_docs(KUBERNETES / name)]
    assert sorted((o["kind"], o["metadata"]["name"]) for o in rendered) == \
        sorted((o["kind"], o["metadata"]["name"]) for o in expected)
    for obj in rendered:
        model = MODELS[(obj["apiVersion"], obj["kind"])]
        assert not strict_problems(obj, model, obj["kind"])
        assert obj["metadata"]["labels"]["app.kubernetes.io/part-of"] == "tidewire"
    (deployment,) = [o for o in rendered if o["kind"] == "Deployment"]
    # the `images` transformer applies: the image is set in one place
    (image,) = [i for i in kustomization["images"] if i["name"] == "tidewire"]
    assert container(deployment)["image"] == f"{image['newName']}:{image['newTag']}"


# -- the gateway Deployment ----------------------------------------------------------------------------------

def test_deployment_probes_on_the_admin_port() -> None:
    deployment = the("Deployment", "tidewire")
    c = container(deployment)
    admin = config_values()["admin_port"]
    assert admin == ADMIN_PORT
    for probe, path in (("readinessProbe", "/readyz"), ("livenessProbe", "/healthz"), ("startupProbe", "/healthz")):
        get = c[probe]["httpGet"]
        assert get["path"] == path, probe
        assert port_number(c, get["port"]) == admin, probe
    assert deployment["spec"]["template"]["metadata"]["annotations"]["prometheus.io/port"] == str(admin)


def test_deployment_drains_within_the_grace_period() -> None:
    spec = the("Deployment", "tidewire")["spec"]["template"]["spec"]
    pre_stop = container({"spec": {"template": {"spec": spec}}})["lifecycle"]["preStop"]["exec"]["command"]
    assert pre_stop[0] == "sleep"
    drain = float(config_values()["drain_timeout"])
    assert drain > 0
    assert spec["terminationGracePeriodSeconds"] > float(pre_stop[1]) + drain


def test_deployment_shape() -> None:
    deployment = the("Deployment", "tidewire")
    spec = deployment["spec"]
    assert spec["replicas"] == 3
    assert selects(spec["selector"]["matchLabels"], spec["template"]["metadata"]["labels"])
    assert spec["strategy"]["rollingUpdate"]["maxUnavailable"] == 0
    pod = spec["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True
    assert pod["securityContext"]["runAsUser"] == 10001  # the image's `tidewire` user (deploy/Dockerfile)
    c = container(deployment)
    assert c["securityContext"]["allowPrivilegeEscalation"] is False
    assert c["resources"]["requests"]["cpu"] and c["resources"]["limits"]["memory"]
    assert not serve_argv_problems(c["args"]), serve_argv_problems(c["args"])
    env = {e["name"]: e for e in c["env"]}
    assert env["TIDEWIRE_NODE_ID"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["TIDEWIRE_CLUSTER_HOST"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    for name in env:
        assert name.removeprefix("TIDEWIRE_").lower() in Settings.model_fields, name
    # every listener the settings file turns on is a container port, and the names are unique
    ports = {p["name"]: p["containerPort"] for p in c["ports"]}
    assert len(ports) == len(c["ports"])
    values = config_values()
    for setting, name in (("port", "mqtt"), ("ws_port", "ws"), ("amqp_port", "amqp"),
                          ("rocketmq_port", "rocketmq"), ("admin_port", "admin"), ("cluster_port", "cluster")):
        assert ports[name] == values[setting], setting


def test_deployment_references_resolve() -> None:
    """Volumes name the ConfigMap and Secret, secretKeyRefs name existing keys, and every file the settings name
    lies in a mounted volume that has it."""
    deployment = the("Deployment", "tidewire")
    pod = deployment["spec"]["template"]["spec"]
    c = container(deployment)
    config_map = the("ConfigMap")
    secret = the("Secret")
    volumes = {v["name"]: v for v in pod["volumes"]}
    files: dict[str, set[str]] = {}  # mount path -> the files its ConfigMap or Secret volume holds
    writable = set()
    for mount in c["volumeMounts"]:
        volume = volumes[mount["name"]]
        if "configMap" in volume:
            assert volume["configMap"]["name"] == config_map["metadata"]["name"]
            files[mount["mountPath"]] = set(config_map["data"])
        elif "secret" in volume:
            assert volume["secret"]["secretName"] == secret["metadata"]["name"]
            files[mount["mountPath"]] = set(secret["stringData"])
        else:
            assert "emptyDir" in volume
            writable.add(mount["mountPath"])
    for e in c["env"]:
        ref = e.get("valueFrom", {}).get("secretKeyRef")
        if ref:
            assert ref["name"] == secret["metadata"]["name"] and ref["key"] in secret["stringData"], e["name"]

    def provided(path: str) -> bool:
        p = Path(path)
        return str(p.parent) in files and p.name in files[str(p.parent)]

    config_path = c["args"][c["args"].index("--config") + 1]
    assert provided(config_path)
    values = config_values()
    for setting in ("api_token_file", "password_file"):
        assert provided(values[setting]), setting
    assert values["data_dir"] in writable
    assert c["securityContext"]["readOnlyRootFilesystem"] is True and "/tmp" in writable


def test_settings_file_is_accepted_by_the_node(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The ConfigMap's file plus the Deployment's env make valid Settings (extra fields are refused)."""
    for name in list(os.environ):
        if name.startswith("TIDEWIRE_"):
            monkeypatch.delenv(name)
    monkeypatch.setenv("TIDEWIRE_NODE_ID", "tidewire-7d9f-abcde")
    monkeypatch.setenv("TIDEWIRE_CLUSTER_HOST", "10.1.2.3")
    monkeypatch.setenv("TIDEWIRE_CLUSTER_SECRET", the("Secret")["stringData"]["cluster_secret"])
    path = tmp_path / "tidewire.yaml"
    path.write_text(config_file_text())
    settings = Settings.load(path)
    assert settings.node_id == "tidewire-7d9f-abcde" and settings.cluster_host == "10.1.2.3"
    assert settings.admin_port == ADMIN_PORT and settings.host == "0.0.0.0"
    assert settings.allow_anonymous is False
    # the store URL names the Redis Service and its port
    redis_service = the("Service", "tidewire-redis")
    (redis_port,) = redis_service["spec"]["ports"]
    assert settings.store == f"redis://{redis_service['metadata']['name']}:{redis_port['port']}/0"
    # a typo in the file is an error, not a silently ignored line
    path.write_text(config_file_text().replace("drain_timeout", "drain_timout"))
    with pytest.raises(ValueError):
        Settings.load(path)


def test_secret_holds_only_placeholders() -> None:
    secret = the("Secret", "tidewire-secrets")
    assert "data" not in secret, "no base64 values: every value is a visible placeholder"
    assert set(secret["stringData"]) == {"cluster_secret", "api_token", "passwd", "tls.crt", "tls.key"}
    for key, value in secret["stringData"].items():
        assert "REPLACE-ME" in value, key
    # the placeholder password file has no user lines: with allow_anonymous false nobody gets in by accident
    lines = [ln for ln in secret["stringData"]["passwd"].splitlines() if ln.strip()]
    assert all(ln.lstrip().startswith("#") for ln in lines)


# -- Services, Redis, PDB, HPA, NetworkPolicy ------------------------------------------------------------------

def test_services_select_the_right_pods_and_ports() -> None:
    deployment = the("Deployment", "tidewire")
    redis = the("StatefulSet", "tidewire-redis")
    for service in [o for o in objects() if o["kind"] == "Service"]:
        selector = service["spec"]["selector"]
        target = redis if service["metadata"]["name"] == "tidewire-redis" else deployment
        other = deployment if target is redis else redis
        assert selects(selector, target["spec"]["template"]["metadata"]["labels"]), service["metadata"]["name"]
        assert not selects(selector, other["spec"]["template"]["metadata"]["labels"]), service["metadata"]["name"]
        c = container(target)
        for port in service["spec"]["ports"]:
            assert port_number(c, port["targetPort"]) == port["port"], (service["metadata"]["name"], port)
    admin = the("Service", "tidewire-admin")
    assert [p["port"] for p in admin["spec"]["ports"]] == [ADMIN_PORT]
    assert admin["spec"]["type"] == "ClusterIP"
    assert the("Service", "tidewire-mqtt-public")["spec"]["type"] == "LoadBalancer"
    assert the("Service", "tidewire-mqtt")["spec"]["ports"][0]["port"] == 1883


def test_redis_statefulset_keeps_an_aof_on_a_volume() -> None:
    redis = the("StatefulSet", "tidewire-redis")
    c = container(redis)
    args = c["args"]
    assert args[args.index("--appendonly") + 1] == "yes"
    assert args[args.index("--appendfsync") + 1] == "always"
    assert args[args.index("--maxmemory-policy") + 1] == "noeviction"
    data_dir = args[args.index("--dir") + 1]
    (claim,) = redis["spec"]["volumeClaimTemplates"]
    (mount,) = c["volumeMounts"]
    assert mount["name"] == claim["metadata"]["name"] and mount["mountPath"] == data_dir
    assert claim["spec"]["resources"]["requests"]["storage"]
    headless = the("Service", redis["spec"]["serviceName"])
    assert headless["spec"]["clusterIP"] == "None"
    assert redis["spec"]["template"]["spec"]["securityContext"]["runAsNonRoot"] is True


def test_pdb_and_hpa() -> None:
    deployment = the("Deployment", "tidewire")
    labels = deployment["spec"]["template"]["metadata"]["labels"]
    pdb = the("PodDisruptionBudget")
    assert pdb["spec"]["maxUnavailable"] == 1
    assert selects(pdb["spec"]["selector"]["matchLabels"], labels)
    hpa = the("HorizontalPodAutoscaler")
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert (hpa["spec"]["minReplicas"], hpa["spec"]["maxReplicas"]) == (3, 10)
    ref = hpa["spec"]["scaleTargetRef"]
    assert (ref["apiVersion"], ref["kind"], ref["name"]) == ("apps/v1", "Deployment", "tidewire")
    assert "prometheus-adapter" in (KUBERNETES / "hpa.yaml").read_text()


def test_redis_network_policy_admits_the_gateways() -> None:
    policy = the("NetworkPolicy")
    redis_labels = the("StatefulSet", "tidewire-redis")["spec"]["template"]["metadata"]["labels"]
    gateway_labels = the("Deployment", "tidewire")["spec"]["template"]["metadata"]["labels"]
    assert selects(policy["spec"]["podSelector"]["matchLabels"], redis_labels)
    (rule,) = policy["spec"]["ingress"]
    assert any(selects(peer["podSelector"]["matchLabels"], gateway_labels) for peer in rule["from"])
    assert [p["port"] for p in rule["ports"]] == [6379]
