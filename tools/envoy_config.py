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


def render(
    endpoints: Sequence[tuple[str, int]],
    *,
    dns: bool,
    listen_port: int = 8080,
    listen_address: str = "0.0.0.0",
    admin_port: int = 9901,
    health_interval_s: float = 5.0,
) -> dict[str, Any]:
    """The config as a dict. `dns`: STRICT_DNS (every A record of each name is a
    replica), else STATIC IP endpoints."""
    text = string.Template(TEMPLATE.read_text()).substitute(
        listen_address=listen_address, listen_port=listen_port, admin_port=admin_port,
        cluster_type="STRICT_DNS" if dns else "STATIC", health_interval=f"{health_interval_s}s",
    )
    config = yaml.safe_load(text)
    lb_endpoints = [
        {"endpoint": {"address": {"socket_address": {"address": host, "port_value": port}}}} for host, port in endpoints
    ]
    clusters = config["static_resources"]["clusters"]
    for i, cluster in enumerate(clusters):
        cluster = clusters[i] = copy.deepcopy(cluster)  # merge keys share one dict
        cluster["load_assignment"] = {"cluster_name": cluster["name"], "endpoints": [{"lb_endpoints": lb_endpoints}]}
    return config


def dump(config: dict[str, Any]) -> str:
    return HEADER + yaml.safe_dump(config, sort_keys=False, width=120)


def compose_config() -> str:
    return dump(render([("llmserve", 50051)], dns=True))


def k8s_configmap() -> str:
    config = render([("llmserve-headless.llmserve.svc", 50051)], dns=True)  # the headless Service
    configmap = {
        "apiVersion": "v1", "kind": "ConfigMap",
        "metadata": {"name": "llmserve-envoy"},  # mounted by envoy-deployment.yaml
        "data": {"envoy.yaml": dump(config)},
    }
    return HEADER + yaml.dump(configmap, Dumper=_BlockDumper, sort_keys=False, width=120)


class _BlockDumper(yaml.SafeDumper):
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
