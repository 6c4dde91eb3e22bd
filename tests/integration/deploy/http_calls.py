"""What the OpenAI-HTTP-through-Envoy tests share: a cluster whose replicas serve the HTTP
API beside gRPC (with Gemma 3's chat template), the official `openai` SDK pointed at
Envoy's HTTP listener with its own retries off (every retry seen is Envoy's), and what
each replica did, read from its /metrics."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path

from openai import OpenAI

from harness.envoy_cluster import REPLICA_ARGS, Cluster, Replica
from tests.integration.deploy.envoy_calls import AFFINITY

AFFINITY_CLUSTER = "llmserve_http_affinity"  # Envoy's MAGLEV cluster of the replicas' HTTP ports


def start_http_cluster(directory: Path, num_replicas: int = 2) -> Cluster:
    cluster = Cluster(directory, num_replicas=num_replicas, http=True,
                      replica_args=REPLICA_ARGS)
    try:
        cluster.start()
    except BaseException:
        cluster.stop()
        raise
    return cluster


def openai_client(cluster: Cluster, affinity: str | None = None) -> OpenAI:
    """The SDK on Envoy's HTTP listener; `affinity`: every call carries that key."""
    headers = {AFFINITY: affinity} if affinity else None
    return OpenAI(base_url=f"http://127.0.0.1:{cluster.http_port}/v1", api_key="unused", max_retries=0,
                  timeout=120, default_headers=headers)


def ask(client: OpenAI, model: str, prompt: str, max_tokens: int = 2, **extra: object) -> int:
    """One whole chat completion; its completion tokens."""
    reply = client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}],
                                           max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True},
                                           **extra)  # type: ignore[arg-type]
    assert reply.usage is not None
    return reply.usage.completion_tokens


def decoded_tokens(replica: Replica) -> float:
    """Tokens this replica's executor has decoded for generation: it rises with every chat
    completion it serves whose prompt it has not seen before (a prompt cached with its
    logits needs no decode), whichever surface sent it."""
    return replica.metric('llmserve_batch_tokens_sum{kind="generate"}')


def worked(cluster: Cluster, before: list[float]) -> list[bool]:
    """Which replicas decoded anything since `before` (a `decoded_tokens` per replica)."""
    return [decoded_tokens(r) > b for r, b in zip(cluster.replicas, before, strict=True)]


def snapshot(cluster: Cluster) -> list[float]:
    return [decoded_tokens(r) for r in cluster.replicas]


def key_for_replica(cluster: Cluster, model: str, index: int) -> str:
    """An affinity key that MAGLEV maps to replica `index` on the HTTP listener (found by
    trying keys; the gRPC listener's ring is another one: replicas differ there by port)."""
    for i in range(60):
        key = f"http-key-{index}-{i}"
        before = requests_per_host(cluster, AFFINITY_CLUSTER)
        ask(openai_client(cluster, key), model, "Hi", max_tokens=1)
        if requests_per_host(cluster, AFFINITY_CLUSTER)[index] > before[index]:
            return key
    raise AssertionError(f"no key found for replica {index}: {cluster.host_health(AFFINITY_CLUSTER)}")


def requests_per_host(cluster: Cluster, cluster_name: str) -> list[int]:
    """Requests Envoy has sent to each replica (by index) in one of its clusters, retried
    attempts included, health checks not: where calls went, as Envoy counts them."""
    with urllib.request.urlopen(f"http://127.0.0.1:{cluster.admin_port}/clusters?format=json", timeout=5) as r:
        statuses = json.loads(r.read())["cluster_statuses"]
    by_port = {replica.http_port: i for i, replica in enumerate(cluster.replicas)}
    counts = [0] * len(cluster.replicas)
    for host in next(c for c in statuses if c["name"] == cluster_name).get("host_statuses", []):
        index = by_port[host["address"]["socket_address"]["port_value"]]
        counts[index] = next((int(s.get("value", 0)) for s in host.get("stats", []) if s["name"] == "rq_total"), 0)
    return counts
