"""Deployment files: docker-compose.yml validates (docker-compose config, the Debian
package), Envoy and Prometheus configs parse and point at the service and health check.
No Docker engine or Envoy binary runs here: the containers themselves are not started."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.skipif(shutil.which("docker-compose") is None, reason="docker-compose (Debian package) not installed")
def test_compose_file_validates() -> None:
    out = subprocess.run(["docker-compose", "config"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    config = yaml.safe_load(out.stdout)
    assert config["services"]["llmserve"]["deploy"]["replicas"] >= 2
    assert set(config["services"]) == {"llmserve", "envoy", "prometheus", "grafana"}
    grafana = config["services"]["grafana"]
    # docker-compose 1.x prints the short syntax ("src:dst:ro", "ip:host:container/tcp")
    mounts = dict(_short_volume(v) for v in grafana["volumes"])
    assert mounts["deploy/grafana/provisioning"] == "/etc/grafana/provisioning"
    assert mounts["deploy/grafana/dashboards"] == "/var/lib/grafana/dashboards"
    for service in ("grafana", "prometheus"):  # UIs on loopback only
        ports = config["services"][service]["ports"]
        assert all((p["host_ip"] if isinstance(p, dict) else p.split(":")[0]) == "127.0.0.1" for p in ports)


def _short_volume(volume: str | dict[str, str]) -> tuple[str, str]:
    source, target = (volume["source"], volume["target"]) if isinstance(volume, dict) else volume.split(":")[:2]
    return Path(source).resolve().relative_to(ROOT.resolve()).as_posix(), target


def test_envoy_balances_grpc_with_active_health_checks() -> None:
    envoy = yaml.safe_load((ROOT / "deploy" / "envoy.yaml").read_text())
    cluster = envoy["static_resources"]["clusters"][0]
    assert cluster["health_checks"][0]["grpc_health_check"]["service_name"] == "llmserve.v1.LLMService"
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http2_protocol_options" in options["explicit_http_config"]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert endpoint == {"address": "llmserve", "port_value": 50051}


def test_rendered_envoy_configs_match_the_template() -> None:
    from tools import envoy_config

    assert envoy_config.main(["--check"]) == 0, "run python -m tools.envoy_config"
    envoy = yaml.safe_load((ROOT / "deploy" / "envoy.yaml").read_text())
    assert envoy["admin"]["address"]["socket_address"]["address"] == "127.0.0.1"  # admin on loopback only
    clusters = {c["name"]: c for c in envoy["static_resources"]["clusters"]}
    assert clusters["llmserve"]["lb_policy"] == "LEAST_REQUEST" and clusters["llmserve_affinity"]["lb_policy"] == "MAGLEV"
    route = envoy["static_resources"]["listeners"][0]["filter_chains"][0]["filters"][0]["typed_config"]["route_config"]
    retry = route["virtual_hosts"][0]["retry_policy"]
    assert {"unavailable", "resource-exhausted"} <= set(retry["retry_on"].split(","))
    assert retry["rate_limited_retry_back_off"]["reset_headers"][0]["name"] == "retry-after"


def test_compose_does_not_publish_envoy_admin() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    assert compose["services"]["envoy"]["ports"] == ["8080:8080"]


def test_prometheus_scrapes_every_replica() -> None:
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    sd = prometheus["scrape_configs"][0]["dns_sd_configs"][0]
    assert sd["names"] == ["llmserve"] and sd["port"] == 9090


def test_dockerfile_runs_as_non_root_with_a_health_probe() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "USER llmserve" in text and "HEALTHCHECK" in text and "llmserve.service.model.files" in text


def test_grafana_provisions_the_dashboard_on_the_prometheus_datasource() -> None:
    provisioning = ROOT / "deploy" / "grafana" / "provisioning"
    source = yaml.safe_load((provisioning / "datasources" / "prometheus.yml").read_text())["datasources"][0]
    assert source["url"] == "http://prometheus:9090" and source["type"] == "prometheus"
    provider = yaml.safe_load((provisioning / "dashboards" / "llmserve.yml").read_text())["providers"][0]
    assert provider["options"]["path"] == "/var/lib/grafana/dashboards"
    dashboard = json.loads((ROOT / "deploy" / "grafana" / "dashboards" / "llmserve.json").read_text())
    uids = {target["datasource"]["uid"] for panel in dashboard["panels"] for target in panel["targets"]}
    assert uids == {source["uid"]}
