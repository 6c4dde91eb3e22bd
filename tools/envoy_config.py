"""Render deploy/envoy/envoy.template.yaml: the one Envoy config compose, Kubernetes and
the tests use.

    python -m tools.envoy_config            # rewrite deploy/envoy.yaml and the k8s ConfigMap
    python -m tools.envoy_config --check    # fail if either differs from the template

`render()` is what the tests call, with loopback endpoints.
"""

from __future__ import annotations

import argparse
import copy
import string
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import yaml

ROOT = Path(__file__).resolve().parents[1]
TEMPLATE = ROOT / "deploy" / "envoy" / "envoy.template.yaml"
COMPOSE_OUT = ROOT / "deploy" / "envoy.yaml"
K8S_OUT = ROOT / "deploy" / "k8s" / "envoy-configmap.yaml"
HEADER = "# Generated from deploy/envoy/envoy.template.yaml by `python -m tools.envoy_config`: edit the template.\n"


HTTP_LISTENER = "http"
HTTP_CLUSTERS = ("llmserve_http", "llmserve_http_affinity")  # the replicas' HTTP port (the OpenAI API)
COMPOSE_HTTP_LISTEN_PORT = 8081  # Envoy's OpenAI HTTP listener in compose and Kubernetes
REPLICA_HTTP_PORT = 8080  # LLMSERVE_HTTP_PORT of the image, compose and the Deployment
KEYLESS_POLICIES = ("orca", "least_request")


def render(
    endpoints: Sequence[tuple[str, int]],
    *,
    dns: bool,
    http_endpoints: Sequence[tuple[str, int]] = (),
    listen_port: int = 8080,
    http_listen_port: int | None = None,
    listen_address: str = "0.0.0.0",
    admin_port: int = 9901,
    health_interval_s: float = 5.0,
    keyless: str = "orca",
    bounded_load: bool = True,
) -> dict[str, Any]:
    """The config as a dict. `endpoints`: the replicas' gRPC addresses; `http_endpoints`:
    the same replicas' HTTP ports, served on `http_listen_port` (None: no HTTP listener and
    no HTTP clusters, the gRPC path alone). `dns`: STRICT_DNS (every A record of each name
    is a replica), else STATIC IP endpoints. `keyless`: how gRPC calls without an affinity
    key are balanced (gRPC and HTTP), "orca" (the template's weighted round robin) or "least_request";
    `bounded_load`: the affinity cluster's hash_balance_factor (bench.routing compares)."""
    if keyless not in KEYLESS_POLICIES:
        raise ValueError(f"keyless={keyless!r}: expected one of {', '.join(KEYLESS_POLICIES)}")
    text = string.Template(TEMPLATE.read_text()).substitute(
        listen_address=listen_address, listen_port=listen_port, admin_port=admin_port,
        http_listen_port=http_listen_port or 0,
        cluster_type="STRICT_DNS" if dns else "STATIC", health_interval=f"{health_interval_s}s",
    )
    config = yaml.safe_load(text)
    resources = config["static_resources"]
    if http_listen_port is None:
        resources["listeners"] = [li for li in resources["listeners"] if li["name"] != HTTP_LISTENER]
        resources["clusters"] = [c for c in resources["clusters"] if c["name"] not in HTTP_CLUSTERS]
    clusters = resources["clusters"]
    for i, cluster in enumerate(clusters):
        cluster = clusters[i] = copy.deepcopy(cluster)  # merge keys share one dict
        if cluster["name"] in ("llmserve", "llmserve_http") and keyless == "least_request":
            del cluster["load_balancing_policy"]
            cluster["lb_policy"] = "LEAST_REQUEST"
        if cluster["name"] in ("llmserve_affinity", "llmserve_http_affinity") and not bounded_load:
            del cluster["common_lb_config"]
        lb_endpoints = _lb_endpoints(http_endpoints if cluster["name"] in HTTP_CLUSTERS else endpoints)
        cluster["load_assignment"] = {"cluster_name": cluster["name"], "endpoints": [{"lb_endpoints": lb_endpoints}]}
    return config


def _lb_endpoints(endpoints: Sequence[tuple[str, int]]) -> list[dict[str, Any]]:
    return [{"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}} for host, port in endpoints]


class _PlainDumper(yaml.SafeDumper):
    """Every shared value written out in full (the template's anchors), no `&id001` aliases."""

    def ignore_aliases(self, data: Any) -> bool:
        return True


def dump(config: dict[str, Any]) -> str:
    return HEADER + yaml.dump(config, Dumper=_PlainDumper, sort_keys=False, width=120)


def compose_config() -> str:
    return dump(render([("llmserve", 50051)], http_endpoints=[("llmserve", REPLICA_HTTP_PORT)], dns=True,
                       http_listen_port=COMPOSE_HTTP_LISTEN_PORT))


def k8s_configmap() -> str:
    headless = "llmserve-headless.llmserve.svc"  # the headless Service
    config = render([(headless, 50051)], http_endpoints=[(headless, REPLICA_HTTP_PORT)], dns=True,
                    http_listen_port=COMPOSE_HTTP_LISTEN_PORT)
    configmap = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "llmserve-envoy"},  # mounted by envoy-deployment.yaml
        "data": {"envoy.yaml": dump(config)},
    }
    return HEADER + yaml.dump(configmap, Dumper=_BlockDumper, sort_keys=False, width=120)


class _BlockDumper(_PlainDumper):
    """Multi-line strings as `|` blocks (the ConfigMap's envoy.yaml stays readable)."""


_BlockDumper.add_representer(
    str, lambda dumper, text: dumper.represent_scalar("tag:yaml.org,2002:str", text, style="|" if "\n" in text else None)
)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--check", action="store_true", help="exit 1 if a rendered file is out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in ((COMPOSE_OUT, compose_config()), (K8S_OUT, k8s_configmap())):
        if args.check:
            if not path.exists() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
    if stale:
        print(f"out of date (run python -m tools.envoy_config): {', '.join(stale)}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
