"""Continuous batching: concurrent greedy streams agree with their solo runs."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

from llmserve.client import Client, pb

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):",
    "Once upon a time, in a small village,",
    "The three primary colors are",
    "To make a cup of tea, first",
    "import numpy as np\n",
    "The largest planet in the solar system is",
    "Dear hiring manager,",
]


def _prefix(a: tuple[int, ...], b: tuple[int, ...]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def test_eight_concurrent_streams_match_solo_prefixes(server) -> None:  # type: ignore[no-untyped-def]
    kw = dict(max_tokens=32, temperature=0, ignore_eos=True)
    with Client(server.address, timeout=120) as client:
        solo = [client.generate(p, **kw) for p in PROMPTS]
        with ThreadPoolExecutor(len(PROMPTS)) as pool:
            together = list(pool.map(lambda p: client.generate(p, **kw), PROMPTS))
    for result in together:
        assert result.turn_end.finish_reason == pb.FINISH_REASON_LENGTH
        assert result.turn_end.usage.completion_tokens == 32
    prefixes = [_prefix(s.token_ids, t.token_ids) for s, t in zip(solo, together)]
    print(f"common prefix lengths (of 32): {prefixes}")
    assert sum(p >= 8 for p in prefixes) >= 7, prefixes
