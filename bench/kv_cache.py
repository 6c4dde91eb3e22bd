"""KV cache types compared in-process (no gRPC): bytes per token, slots per memory
budget, decode throughput at 8 streams, and quality against f16.

    python -m bench.kv_cache [--types f16,q8_0,q4_0] [--threads 2] [--out docs/kv-cache.md]

Quality: greedy agreement with f16 over 200 tokens on 10 prompts (tokens equal
position by position, and the common prefix), and the mean log-likelihood of a
fixed text evaluated in one pass.
"""

from __future__ import annotations

import argparse
import platform
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from llmserve.service.config import KVCacheSettings
from llmserve.service.engine.executor.logprobs import log_softmax
from llmserve.service.model.default_model import default_model_path
from llmserve.service.model.runner import LlamaRunner
from llmserve.service.model.runner_config import RunnerConfig

PROMPTS = [
    "The history of the printing press",
    "Photosynthesis is the process by which",
    "def binary_search(items, target):",
    "The three most important inventions of the twentieth century are",
    "Once upon a time in a quiet mountain village,",
    "To bake sourdough bread you need",
    "The main differences between TCP and UDP are",
    "In the year 1969, humans",
    "A good night's sleep matters because",
    "The recipe calls for two cups of flour,",
]
TEXT = (
    "The river wound slowly through the valley, past fields of wheat and small stone houses. "
    "In the morning the fishermen pushed their boats into the water, and by noon the market "
    "square was full of voices, bread, and the smell of the catch. Children ran between the "
    "stalls while their parents argued about prices, the weather, and the coming harvest."
)
BUDGET_BYTES = 1 << 30
SLOT_TOKENS = 4096
GEN_TOKENS = 200


@dataclass
class Result:
    cache_type: str
    bytes_per_token: float
    tokens_per_s_8: float
    greedy: list[list[int]]
    mean_loglik: float


def _runner(cache_type: str, threads: int) -> LlamaRunner:
    return LlamaRunner(
        RunnerConfig(
            model_path=default_model_path(), n_ctx=8192, n_parallel=8, n_batch=512, n_ubatch=512,
            n_threads=threads, embeddings=False,
            kv_cache=KVCacheSettings(cache_type_k=cache_type, cache_type_v=cache_type),
        )
    )


def _clear(r: LlamaRunner) -> None:
    for s in range(8):
        r.seq_rm(s, -1, -1)


def _bytes_per_token(r: LlamaRunner) -> float:
    _clear(r)
    tokens = [2] + [1000 + i for i in range(511)]
    r.batch.clear()
    r.batch.add(tokens, 0, 0, False)
    assert r.decode() == 0
    size = len(r.seq_state(0))
    r.seq_rm(0, -1, -1)
    return size / len(tokens)


def _greedy(r: LlamaRunner, prompt: str) -> list[int]:
    _clear(r)
    tokens = r.tokenizer.tokenize(prompt, True, True)
    r.batch.clear()
    row = r.batch.add(tokens, 0, 0, True)
    out: list[int] = []
    pos = len(tokens)
    for _ in range(GEN_TOKENS):
        assert r.decode() == 0
        token = int(r.logits_row(row).argmax())
        out.append(token)
        r.batch.clear()
        row = r.batch.add([token], pos, 0, True)
        pos += 1
    return out


def _throughput_8(r: LlamaRunner) -> float:
    _clear(r)
    for s in range(8):
        r.batch.clear()
        r.batch.add(r.tokenizer.tokenize(PROMPTS[s], True, True), 0, s, False)
        assert r.decode() == 0
    positions = [len(r.tokenizer.tokenize(PROMPTS[s], True, True)) for s in range(8)]
    start = time.perf_counter()
    steps = 64
    for _ in range(steps):
        r.batch.clear()
        for s in range(8):
            r.batch.add([1234], positions[s], s, True)
            positions[s] += 1
        assert r.decode() == 0
    return 8 * steps / (time.perf_counter() - start)


def _mean_loglik(r: LlamaRunner) -> float:
    _clear(r)
    tokens = r.tokenizer.tokenize(TEXT, True, True)
    r.batch.clear()
    r.batch.add(tokens, 0, 0, False)
    r.batch.mark_all_outputs()
    assert r.decode() == 0
    total = sum(float(log_softmax(r.logits_row(i))[tokens[i + 1]]) for i in range(len(tokens) - 1))
    return total / (len(tokens) - 1)


def measure(cache_type: str, threads: int) -> Result:
    r = _runner(cache_type, threads)
    try:
        return Result(
            cache_type=cache_type,
            bytes_per_token=_bytes_per_token(r),
            tokens_per_s_8=_throughput_8(r),
            greedy=[_greedy(r, p) for p in PROMPTS],
            mean_loglik=_mean_loglik(r),
        )
    finally:
        r.close()


def _agreement(a: list[list[int]], b: list[list[int]]) -> tuple[float, float]:
    equal = sum(x == y for ra, rb in zip(a, b) for x, y in zip(ra, rb)) / sum(len(r) for r in a)
    prefixes = [next((i for i, (x, y) in enumerate(zip(ra, rb)) if x != y), len(ra)) for ra, rb in zip(a, b)]
    return equal, float(np.mean(prefixes))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--types", default="f16,q8_0,q4_0")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    results = [measure(t, args.threads) for t in args.types.split(",")]
    base = results[0]
    lines = [
        f"| K/V type | KV bytes/token | slots of {SLOT_TOKENS} tokens in 1 GiB | decode tok/s, 8 streams "
        f"| greedy tokens equal to {base.cache_type} (200 × 10) | mean common prefix | mean log-likelihood |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in results:
        equal, prefix = _agreement(base.greedy, r.greedy)
        slots = int(BUDGET_BYTES // (r.bytes_per_token * SLOT_TOKENS))
        lines.append(
            f"| {r.cache_type} | {r.bytes_per_token:,.0f} | {slots} | {r.tokens_per_s_8:.1f} "
            f"| {equal * 100:.1f}% | {prefix:.1f} | {r.mean_loglik:.4f} |"
        )
    table = "\n".join(lines)
    print(table)
    if args.out:
        args.out.write_text(
            args.out.read_text().split("<!-- results -->")[0]
            + "<!-- results -->\n"
            + f"Measured {time.strftime('%Y-%m-%d')} on {platform.machine()}, {args.threads} threads "
            + f"(`python -m bench.kv_cache --out {args.out}`):\n\n"
            + table
            + "\n"
        )


if __name__ == "__main__":
    main()
