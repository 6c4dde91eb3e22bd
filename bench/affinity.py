"""Session affinity behind Envoy: prefix-cache hits and TTFT with and without it (issue 16).

    python -m bench.affinity [--requests 48] [--tenants 6] [--out docs/deployment.md]

3 llmserve replicas (-np 2 each) behind the project's Envoy config. Each tenant has its
own long shared prefix (a ~400-token document) and asks short questions about it
(8 new tokens, greedy), 3 calls at a time. Run twice on fresh replicas: without an
affinity key (LEAST_REQUEST) and with `x-llmserve-affinity: <tenant>` (MAGLEV). Reports
the prefix-cache hit rate (sum cached_tokens / sum prompt_tokens) and TTFT percentiles.
"""

from __future__ import annotations

import argparse
import random
import re
import statistics
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import grpc
from llmserve.client import make_input, pb, session_config
from llmserve.v1 import llmserve_pb2_grpc as pb_grpc

from harness.envoy_cluster import Cluster

WORDS = ("invoice contract supplier warranty shipment clause delivery payment schedule penalty "
         "audit ledger customer region quarter revenue margin forecast inventory").split()


def tenant_document(tenant: int, words: int = 330) -> str:
    rng = random.Random(tenant)
    return f"Tenant {tenant} handbook. " + " ".join(rng.choice(WORDS) for _ in range(words)) + "\n\n"


def _call(channel: grpc.Channel, tenant: int, question: int, affinity: bool) -> tuple[int, int, float]:
    prompt = tenant_document(tenant) + f"Question {question}: what does the handbook say about item {question}?"
    request = pb.GenerateRequest(config=session_config(max_tokens=8, temperature=0), input=make_input(prompt),
                                 end_of_turn=True)
    metadata = (("x-llmserve-affinity", f"tenant-{tenant}"),) if affinity else ()
    start = time.perf_counter()
    ttft = None
    for response in pb_grpc.LLMServiceStub(channel).Generate(iter([request]), metadata=metadata, timeout=600):
        if ttft is None and response.HasField("chunk"):
            ttft = time.perf_counter() - start
        if response.HasField("turn_end"):
            usage = response.turn_end.usage
            return usage.prompt_tokens, usage.cached_tokens, ttft if ttft is not None else time.perf_counter() - start
    raise RuntimeError("no turn end")


def run(affinity: bool, num_requests: int, num_tenants: int) -> dict[str, float]:
    rng = random.Random(7)
    plan = [(rng.randrange(num_tenants), q) for q in range(num_requests)]
    with tempfile.TemporaryDirectory() as directory:
        cluster = Cluster(Path(directory))
        cluster.start()
        try:
            with grpc.insecure_channel(cluster.address) as channel, ThreadPoolExecutor(3) as pool:
                results = list(pool.map(lambda job: _call(channel, job[0], job[1], affinity), plan))
        finally:
            cluster.stop()
    prompt = sum(r[0] for r in results)
    cached = sum(r[1] for r in results)
    ttfts = sorted(r[2] for r in results)
    return {
        "hit_rate": cached / prompt,
        "ttft_p50": statistics.median(ttfts),
        "ttft_p90": ttfts[int(0.9 * (len(ttfts) - 1))],
        "prompt_tokens": prompt,
        "cached_tokens": cached,
    }


def table(results: dict[str, dict[str, float]], command: str) -> str:
    lines = [f"Measured with `{command}` ({time.strftime('%Y-%m-%d')}):", "",
             "| routing | prefix-cache hit rate | cached / prompt tokens | TTFT p50 | TTFT p90 |", "|---|---|---|---|---|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['hit_rate']:.1%} | {int(r['cached_tokens']):,} / {int(r['prompt_tokens']):,} "
                     f"| {r['ttft_p50'] * 1000:,.0f} ms | {r['ttft_p90'] * 1000:,.0f} ms |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=48)
    parser.add_argument("--tenants", type=int, default=6)
    parser.add_argument("--out", type=Path, help="rewrite the <!-- affinity --> section of this file")
    args = parser.parse_args()
    results = {
        "LEAST_REQUEST, no key": run(False, args.requests, args.tenants),
        "MAGLEV on x-llmserve-affinity": run(True, args.requests, args.tenants),
    }
    text = table(results, f"python -m bench.affinity --requests {args.requests} --tenants {args.tenants}")
    print(text)
    if args.out is not None:
        doc = args.out.read_text()
        block = f"<!-- affinity -->\n{text}<!-- /affinity -->"
        args.out.write_text(re.sub(r"<!-- affinity -->.*?<!-- /affinity -->", lambda _: block, doc, flags=re.S))


if __name__ == "__main__":
    main()
