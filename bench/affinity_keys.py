"""The `a-<adapter>` and `m-<model>` affinity keys behind Envoy (issue 43 §5, docs/adapters.md).

    python -m bench.affinity_keys [--calls 60] [--callers 4] [--only adapters|models]

3 llmserve replicas (-np 2 -c 4096 -t 1) behind the project's Envoy config, two setups:
- adapters: each replica may serve 6 LoRA adapters (`--lora`, rank 8, tools/make_adapters.py)
  and holds 2 at once (`--max-loras 2`); each call names one of the 6 at random.
- models: each replica serves the default model and two further ones (`q8a`, `q8b`: the
  Q8_0 requantization under two names) with room for two at once (`--models-max 2`, the
  default included); each call names one of the two further models at random.
Each setup runs twice on fresh replicas: calls without an affinity header (Envoy's keyless
balancing) and with the header the Python SDK sends for them (`ConnectionOptions.call_kwargs`:
`a-<adapter>`, `m-<model>`). `callers` calls at a time, 16 tokens each (greedy, ignore_eos).
A call refused for room (all resident adapters in use, a model still loading) is retried
after half a second, as the refusal's hint asks; its latency counts from its first try.
Reports: adapter or model loads after start-up (the replicas' logs: `adapter_loaded`,
`served_model_loaded`), the Generate calls each replica answered (Envoy's retries of a
refusal on another replica included), Envoy's retries, the refusals that reached the
caller, time to first token (p50, p90) and the wall time.
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from llmserve.client import make_input, pb, session_config
from llmserve.client.connection import ConnectionOptions
from llmserve.service.model.default_model import cache_dir, default_model_path
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.envoy_cluster import REPLICA_ARGS, Cluster
from harness.models import other_model_path
from tools.make_adapters import AdapterSpec, make_all

ADAPTERS = tuple(AdapterSpec(f"k{i}", seed=40 + i, rank=8, strength=0.05, targets=("attn_v", "ffn_down"))
                 for i in range(6))
MODELS = ("q8a", "q8b")
LOAD_EVENTS = {"adapters": "adapter_loaded", "models": "served_model_loaded"}
REFUSED = (grpc.StatusCode.FAILED_PRECONDITION, grpc.StatusCode.RESOURCE_EXHAUSTED, grpc.StatusCode.UNAVAILABLE)


def replica_args(setup: str) -> list[str]:
    if setup == "adapters":
        files = make_all(cache_dir() / "bench-affinity-adapters", default_model_path(), ADAPTERS)
        loras = [flag for name, path in files.items() for flag in ("--lora", f"{name}={path}")]
        return [*REPLICA_ARGS, *loras, "--max-loras", "2"]
    q8 = other_model_path()
    return [*REPLICA_ARGS, "-m", str(default_model_path()), *[f for m in MODELS for f in ("-m", f"{m}={q8}")],
            "--models-max", "2"]


def _config(setup: str, name: str) -> pb.SessionConfig:
    target = {"adapter": name} if setup == "adapters" else {"model": name}
    return session_config(max_tokens=16, temperature=0, ignore_eos=True, **target)


def _call(channel: grpc.Channel, config: pb.SessionConfig, prompt: str, keyed: bool) -> tuple[float, int]:
    """(time to the first token from the first try, tries refused for room)."""
    kwargs = ConnectionOptions().call_kwargs(600, config) if keyed else {"timeout": 600}
    request = pb.GenerateRequest(config=config, input=make_input(prompt), end_of_turn=True)
    start, refused = time.perf_counter(), 0
    while True:
        try:
            ttft = None
            for response in pb_grpc.LLMServiceStub(channel).Generate(iter([request]), **kwargs):
                if ttft is None and response.HasField("chunk"):
                    ttft = time.perf_counter() - start
                if response.HasField("turn_end") and ttft is not None:
                    return ttft, refused
            raise RuntimeError("the turn did not end")
        except grpc.RpcError as exc:
            if exc.code() not in REFUSED or refused >= 40:  # type: ignore[attr-defined]
                raise
            refused += 1
            time.sleep(0.5)


def _loads(cluster: Cluster, event: str) -> list[int]:
    return [sum(1 for p in r.log_path.parent.glob(r.log_path.name + "*") for line in p.read_text().splitlines()
                if event in line) for r in cluster.replicas]


def run(setup: str, keyed: bool, num_calls: int, num_callers: int) -> dict[str, object]:
    rng = random.Random(11)
    names = [spec.name for spec in ADAPTERS] if setup == "adapters" else list(MODELS)
    plan = [(rng.choice(names), i) for i in range(num_calls)]
    with tempfile.TemporaryDirectory() as directory:
        cluster = Cluster(Path(directory), replica_args=replica_args(setup))
        cluster.start()
        try:
            at_start = _loads(cluster, LOAD_EVENTS[setup])
            served_before = [r.generate_calls() for r in cluster.replicas]
            began = time.perf_counter()
            with grpc.insecure_channel(cluster.address) as channel, ThreadPoolExecutor(num_callers) as pool:
                results = list(pool.map(
                    lambda job: _call(channel, _config(setup, job[0]), f"Question {job[1]}: name a colour.", keyed),
                    plan))
            wall = time.perf_counter() - began
            time.sleep(1.0)  # a call's count lands just after its stream ends
            loads = [n - n0 for n, n0 in zip(_loads(cluster, LOAD_EVENTS[setup]), at_start)]
            served = [int(r.generate_calls() - s0) for r, s0 in zip(cluster.replicas, served_before)]
            retries = sum(v for k, v in cluster.envoy_stats("cluster.llmserve").items() if k.endswith(".upstream_rq_retry"))
        finally:
            cluster.stop()
    ttfts = sorted(r[0] for r in results)
    return {"loads": loads, "served": served, "envoy_retries": retries, "refused": sum(r[1] for r in results),
            "refused_calls": sum(1 for r in results if r[1]), "ttft_p50": statistics.median(ttfts),
            "ttft_p90": ttfts[int(0.9 * (len(ttfts) - 1))], "wall": wall, "names": Counter(n for n, _ in plan)}


def table(results: dict[tuple[str, bool], dict[str, object]]) -> str:
    lines = ["| setup | routing | loads after start (per replica) | Generate calls per replica | Envoy's "
             "retries | refused tries (calls) | TTFT p50 | TTFT p90 | wall |", "|---|---|---|---|---|---|---|---|---|"]
    for (setup, keyed), r in results.items():
        loads, served = r["loads"], r["served"]
        routing = ("`a-<adapter>`" if setup == "adapters" else "`m-<model>`") if keyed else "no key"
        lines.append(f"| {setup} | {routing} | {sum(loads)} ({', '.join(map(str, loads))}) "  # type: ignore[call-overload, arg-type]
                     f"| {', '.join(map(str, served))} | {r['envoy_retries']} | {r['refused']} ({r['refused_calls']}) "  # type: ignore[call-overload]
                     f"| {r['ttft_p50'] * 1000:,.0f} ms | {r['ttft_p90'] * 1000:,.0f} ms | {r['wall']:.1f} s |")  # type: ignore[operator]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--calls", type=int, default=60)
    parser.add_argument("--callers", type=int, default=4)
    parser.add_argument("--only", choices=("adapters", "models"))
    args = parser.parse_args()
    setups = [args.only] if args.only else ["adapters", "models"]
    results = {}
    for setup in setups:
        for keyed in (False, True):
            results[(setup, keyed)] = run(setup, keyed, args.calls, args.callers)
            print(setup, "keyed" if keyed else "no key", results[(setup, keyed)], flush=True)
    print(table(results))


if __name__ == "__main__":
    main()
