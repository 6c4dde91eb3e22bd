"""Deployment files: docker-compose.yml validates (docker-compose config, the Debian
package), Envoy and Prometheus configs parse and point at the service and health check.
No Docker engine or Envoy binary runs here: the containers themselves are not started."""

from __future__ import annotations

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
    assert set(config["services"]) == {"llmserve", "envoy", "prometheus"}


def test_envoy_balances_grpc_with_active_health_checks() -> None:
    envoy = yaml.safe_load((ROOT / "deploy" / "envoy.yaml").read_text())
    cluster = envoy["static_resources"]["clusters"][0]
    assert cluster["health_checks"][0]["grpc_health_check"]["service_name"] == "llmserve.v1.LLMService"
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http2_protocol_options" in options["explicit_http_config"]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]["address"]["socket_address"]
    assert endpoint == {"address": "llmserve", "port_value": 50051}


def test_prometheus_scrapes_every_replica() -> None:
    prometheus = yaml.safe_load((ROOT / "deploy" / "prometheus.yml").read_text())
    sd = prometheus["scrape_configs"][0]["dns_sd_configs"][0]
    assert sd["names"] == ["llmserve"] and sd["port"] == 9090


def test_dockerfile_runs_as_non_root_with_a_health_probe() -> None:
    text = (ROOT / "Dockerfile").read_text()
    assert "USER llmserve" in text and "HEALTHCHECK" in text and "llmserve.service.model.files" in text
